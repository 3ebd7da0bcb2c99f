//! What a handler may return.

use std::error::Error;

use ruststream_core::{Cause, HandlerOutcome};

use crate::middleware::Completion;

/// What a handler may return: a [`HandlerOutcome`], or `Result<HandlerOutcome, E>` where
/// `E` is any error type (or a `String`, or an `anyhow::Error`): an `Err` is logged with
/// its `source()` chain and treated as `retry()`; middleware sees the error as a value
/// ([`Completion::Failed`]).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a handler outcome",
    label = "not an outcome",
    note = "a handler returns `HandlerOutcome` (`ack()`, `drop()`, `retry()`, `retry_after(d)`) or `Result<HandlerOutcome, E>` with `E` an error type (`E: Into<Box<dyn Error + Send + Sync>>`: any `std::error::Error + Send + Sync`, `String`, `anyhow::Error`)"
)]
pub trait IntoOutcome {
    /// Converts into a completion.
    fn into_completion(self) -> Completion;
}

impl IntoOutcome for HandlerOutcome {
    fn into_completion(self) -> Completion {
        Completion::Outcome(self)
    }
}

impl<E> IntoOutcome for Result<HandlerOutcome, E>
where
    E: Into<Box<dyn Error + Send + Sync + 'static>>,
{
    fn into_completion(self) -> Completion {
        match self {
            Ok(o) => Completion::Outcome(o),
            Err(e) => Completion::Failed(Cause::new(e)),
        }
    }
}
