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

    /// The current span's trace context as the propagator writes it, into a header set
    /// of its own (empty when there is none).
    pub(super) fn current() -> Headers {
        let mut headers = Headers::new();
        let context = tracing::Span::current().context();
        if context.span().span_context().is_valid() {
            opentelemetry::global::get_text_map_propagator(|propagator| {
                propagator.inject_context(&context, &mut Inject(&mut headers));
            });
        }
        headers
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

/// The current span's trace context, taken once and written into the headers of as many
/// messages as a call sends (`send_all`'s messages share the caller's span): the span and
/// the propagator are asked once, not once a message.
#[derive(Debug)]
pub(crate) struct Captured {
    /// The headers the propagator wrote; empty without a trace context (or the feature).
    headers: Headers,
}

impl Captured {
    /// The current span's trace context.
    pub(crate) fn now() -> Self {
        #[cfg(feature = "opentelemetry")]
        let headers = otel::current();
        #[cfg(not(feature = "opentelemetry"))]
        let headers = Headers::new();
        Self { headers }
    }

    /// Writes the trace context into `headers`, unless they carry one already (a message
    /// passed on keeps its producer's).
    #[inline]
    pub(crate) fn inject(&self, headers: &mut Headers) {
        if self.headers.is_empty() || headers.get("traceparent").is_some() {
            return;
        }
        for (name, value) in self.headers.iter() {
            headers.insert(name, value.clone());
        }
    }
}

/// Writes the current span's trace context into `headers`, unless they carry one already.
pub(crate) fn inject(headers: &mut Headers) {
    Captured::now().inject(headers);
}

/// Makes `span` a child of the trace context `headers` carry, if any.
pub(crate) fn adopt(span: &tracing::Span, headers: &Headers) {
    #[cfg(feature = "opentelemetry")]
    otel::adopt(span, headers);
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, headers);
}
