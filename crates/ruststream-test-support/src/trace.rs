//! Spans exported in memory, for the trace-propagation tests (issue #14).

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;

static EXPORTER: OnceLock<(InMemorySpanExporter, SdkTracerProvider)> = OnceLock::new();

/// Installs, once per process, a `tracing` subscriber that turns spans into OpenTelemetry
/// spans kept in memory, and the W3C propagator; returns the exporter holding them. Call
/// it before anything else sets a subscriber (the broker helpers capture logs).
pub fn capture_spans() -> InMemorySpanExporter {
    let (exporter, _) = EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("ruststream-tests");
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info"))
            .with(tracing_opentelemetry::layer().with_tracer(tracer));
        tracing::subscriber::set_global_default(subscriber)
            .expect("no subscriber set before capture_spans");
        (exporter, provider)
    });
    exporter.clone()
}

/// The finished spans named `name`.
pub fn spans_named(exporter: &InMemorySpanExporter, name: &str) -> Vec<SpanData> {
    exporter
        .get_finished_spans()
        .expect("finished spans")
        .into_iter()
        .filter(|span| span.name == name)
        .collect()
}

/// How many finished spans named `child` are children of the one span named `parent`
/// (same trace, parent span id equal to its span id).
pub fn children_of(exporter: &InMemorySpanExporter, parent: &str, child: &str) -> usize {
    let parents = spans_named(exporter, parent);
    assert_eq!(parents.len(), 1, "one span named {parent}");
    let parent = &parents[0].span_context;
    spans_named(exporter, child)
        .iter()
        .filter(|span| {
            span.span_context.trace_id() == parent.trace_id()
                && span.parent_span_id == parent.span_id()
        })
        .count()
}

/// Waits until [`children_of`] is `want`, for up to `within`.
pub async fn wait_children(
    exporter: &InMemorySpanExporter,
    parent: &str,
    child: &str,
    want: usize,
    within: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + within;
    loop {
        let found = children_of(exporter, parent, child);
        if found == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{found} `{child}` spans are children of `{parent}`, expected {want} within {within:?}; spans: {:?}",
            exporter
                .get_finished_spans()
                .unwrap_or_default()
                .iter()
                .map(|s| (
                    s.name.to_string(),
                    s.span_context.span_id(),
                    s.parent_span_id
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The dead-letter reader of the trace tests: acknowledges whatever arrives.
pub async fn acks(
    ruststream::Message(_): ruststream::Message<String>,
) -> ruststream::HandlerOutcome {
    ruststream::HandlerOutcome::ack()
}

/// Publishes a failing message (`"fail"`) to `address` inside a span named `produce`,
/// through a ruststream [`Publisher`](ruststream::Publisher) over `publish`, then waits
/// until three `delivery` spans are its children: attempts 1 and 2 of a registration
/// with `max_attempts(2)`, and the delivery of its dead letter to a reader. Stops
/// `running`.
pub async fn assert_producer_is_the_parent(
    spans: &InMemorySpanExporter,
    running: ruststream::Running,
    publish: std::sync::Arc<dyn ruststream::core::Publish>,
    address: &str,
) {
    use tracing::Instrument;
    let publisher = ruststream::Publisher::new(publish);
    async {
        publisher
            .to(address)
            .send_bytes(crate::ops::payload("fail"))
            .await
            .expect("publish");
    }
    .instrument(tracing::info_span!("produce"))
    .await;
    wait_children(
        spans,
        "produce",
        "delivery",
        3,
        std::time::Duration::from_secs(60),
    )
    .await;
    running.stop().await;
}
