//! An exact count of Core NATS slow-consumer drops, read from the client's own log.
//!
//! async-nats reports a drop twice: as an `Event::SlowConsumer` on a channel of 128 slots
//! that it fills without waiting (a burst of drops loses most of them, measured 16× too
//! few), and as one DEBUG line per dropped message ("slow consumer detected for
//! subscription {sid}"), which a `tracing` layer sees whether or not anything prints it.
//! [`slow_consumer_layer`] reads the second. The line names the subscription's number
//! only, which is unique within one connection; a drop is counted on the connection that
//! holds that number for a ruststream Core subscription, and left to the events when
//! several connections of the process hold it.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{LevelFilter, filter_fn};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

use crate::drops::{log_counts, sole_holder};

/// The line async-nats logs once per message it drops, before the subscription's number.
const DROP_LINE: &str = "slow consumer detected for subscription ";

/// A `tracing` layer that makes [`Nats::slow_consumer_drops`](crate::Nats::slow_consumer_drops)
/// and the `ruststream_drops_total{kind="slow_consumer_dropped"}` series exact: without
/// it they are a lower bound. Add it to the process's subscriber next to the layer that
/// prints; it prints nothing itself, and it enables only async-nats's DEBUG lines for
/// itself (with a per-layer filter), so the printing layer's filter is untouched. A
/// filter applied to the whole subscriber (`registry().with(EnvFilter::..)`) hides those
/// lines from it: put such a filter on the printing layer instead.
///
/// ```no_run
/// use tracing_subscriber::prelude::*;
/// tracing_subscriber::registry()
///     .with(tracing_subscriber::fmt::layer().with_filter(tracing_subscriber::filter::LevelFilter::INFO))
///     .with(ruststream_nats::slow_consumer_layer())
///     .init();
/// ```
///
/// A drop is attributed to the connection holding the subscription's number; when two
/// connections of the process hold the same number for ruststream Core subscriptions,
/// their drops on it are counted from the client's events, as without the layer.
pub fn slow_consumer_layer<S>() -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    DropLog.with_filter(
        filter_fn(|metadata: &Metadata<'_>| {
            metadata.is_event()
                && metadata.target() == "async_nats"
                && *metadata.level() == Level::DEBUG
        })
        .with_max_level_hint(LevelFilter::DEBUG),
    )
}

struct DropLog;

impl<S: Subscriber> Layer<S> for DropLog {
    fn on_layer(&mut self, _subscriber: &mut S) {
        log_counts();
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut line = DropSid(None);
        event.record(&mut line);
        if let Some(holder) = line.0.and_then(sole_holder) {
            holder.count(line.0.unwrap_or_default());
        }
    }
}

/// Reads the subscription's number out of a drop line.
struct DropSid(Option<u64>);

impl Visit for DropSid {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}")
                .strip_prefix(DROP_LINE)
                .and_then(|sid| sid.parse().ok());
        }
    }
}
