//! A span per delivery, with its address, attempt and outcome.

use tracing::Instrument;

use super::completion::Completion;
use super::service::{Layer, Service};
use crate::extract::Incoming;

/// Opens an `info` span `delivery` per delivery with the fields `registration`,
/// `address`, `attempt` and, once the handler returns, `outcome`.
///
/// With the `opentelemetry` feature the span continues the trace the delivery's headers
/// carry (W3C `traceparent`/`tracestate`, through OpenTelemetry's global propagator,
/// which the service sets: `opentelemetry::global::set_text_map_propagator(
/// opentelemetry_sdk::propagation::TraceContextPropagator::new())`), so with
/// `tracing-opentelemetry` installed it is a child of the producer's span, across
/// processes and brokers. [`Publisher`](crate::Publisher) injects the current span's
/// context into every message it sends; retry copies and dead letters keep the
/// original's headers, and with them its producer's context.
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
        crate::trace_context::adopt(&span, delivery.headers());
        let completion = self.inner.call(incoming).instrument(span.clone()).await;
        span.record("outcome", tracing::field::display(&completion));
        completion
    }
}
