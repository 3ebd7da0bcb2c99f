//! W3C trace context across brokers (feature `opentelemetry`): what [`Publisher`]
//! injects into a message's headers and what [`TraceLayer`] extracts from a delivery's.
//! Both go through OpenTelemetry's global text-map propagator, so the format is the one
//! the service sets up (`TraceContextPropagator` for W3C `traceparent`/`tracestate`);
//! with none set up, nothing is injected or extracted. Without the feature, both are
//! empty functions.
//!
//! [`Publisher`]: crate::Publisher
//! [`TraceLayer`]: crate::middleware::TraceLayer

use ruststream_core::Headers;

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::propagation::{Extractor, Injector};
    use opentelemetry::trace::TraceContextExt;
    use ruststream_core::Headers;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    struct Inject<'a>(&'a mut Headers);

    impl Injector for Inject<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key, value);
        }
    }

    struct Extract<'a>(&'a Headers);

    impl Extractor for Extract<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get_str(key)
        }

        fn keys(&self) -> Vec<&str> {
            self.0.iter().map(|(name, _)| name).collect()
        }
    }

    pub(super) fn inject(headers: &mut Headers) {
        let context = tracing::Span::current().context();
        if !context.span().span_context().is_valid() {
            return;
        }
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut Inject(headers));
        });
    }

    pub(super) fn adopt(span: &tracing::Span, headers: &Headers) {
        let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.extract(&Extract(headers))
        });
        if parent.span().span_context().is_valid() {
            // Fails only for a span already started or disabled: nothing to adopt then.
            let _ = span.set_parent(parent);
        }
    }
}

/// Writes the current span's trace context into `headers`, unless they carry one already
/// (a message passed on keeps its producer's).
pub(crate) fn inject(headers: &mut Headers) {
    #[cfg(feature = "opentelemetry")]
    if headers.get("traceparent").is_none() {
        otel::inject(headers);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = headers;
}

/// Makes `span` a child of the trace context `headers` carry, if any.
pub(crate) fn adopt(span: &tracing::Span, headers: &Headers) {
    #[cfg(feature = "opentelemetry")]
    otel::adopt(span, headers);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, headers);
}
