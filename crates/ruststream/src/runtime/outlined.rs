//! Keeping the uncommon parts of a delivery's life out of the code every delivery runs.
//!
//! An `async fn` that awaits another inlines the awaited future's poll into its own, so a
//! lane's poll holds the code of the dead-letter path, the deadline timer and the
//! conclusion of a retry beside the few instructions an ack runs. On Kafka that made the
//! per-record path touch more code than the L1 instruction cache holds (BENCHMARKS.md,
//! "instruction cache"). Awaiting such a future through [`Outlined`] compiles its poll
//! into a function of its own, called only when that path is taken.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Polls the future it holds (pinned by the caller) from a function that is never
/// inlined.
pub(crate) struct Outlined<'f, F>(pub(crate) Pin<&'f mut F>);

impl<F: Future> Future for Outlined<'_, F> {
    type Output = F::Output;

    #[inline(never)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.0.as_mut().poll(cx)
    }
}
