//! A span per delivery, with its address, attempt and outcome.

use tracing::Instrument;

use super::{Layer, Service};
use crate::extract::Incoming;
use crate::handler::Completion;

/// Opens an `info` span `delivery` per delivery with the fields `registration`,
/// `address`, `attempt` and, once the handler returns, `outcome`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceLayer;

impl<S: Service> Layer<S> for TraceLayer {
    type Service = Trace<S>;

    fn layer(&self, inner: S) -> Trace<S> {
        Trace { inner }
    }
}

/// The service [`TraceLayer`] makes.
#[derive(Debug, Clone)]
pub struct Trace<S> {
    inner: S,
}

impl<S: Service> Service for Trace<S> {
    async fn call(&self, incoming: &Incoming) -> Completion {
        let delivery = incoming.delivery();
        let span = tracing::info_span!(
            "delivery",
            registration = incoming.context().registration(),
            address = delivery.address(),
            attempt = delivery.attempt().number(),
            outcome = tracing::field::Empty,
        );
        let completion = self.inner.call(incoming).instrument(span.clone()).await;
        span.record("outcome", tracing::field::display(&completion));
        completion
    }
}
