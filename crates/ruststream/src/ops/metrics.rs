//! The app's Prometheus metrics: families registered once per app, and per registration
//! a set of handles taken when it starts, so counting a delivery is an atomic add and
//! never formats a label.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

use crate::in_flight::InFlight;
use crate::middleware::Completion;
use std::time::Duration;

use ruststream_core::{BacklogProbe, OutcomeKind};

/// The labels every series of a registration carries.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    registration: String,
    address: String,
    transport: &'static str,
}

/// The labels of a series that also names a kind (an outcome, a copy, an error).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    registration: String,
    address: String,
    transport: &'static str,
    kind: &'static str,
}

/// The labels of a backlog figure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BacklogLabels {
    registration: String,
    address: String,
    transport: &'static str,
    kind: &'static str,
    partition: String,
}

/// How long the broker gets to tell a backlog at a scrape.
const BACKLOG_TIMEOUT: Duration = Duration::from_secs(3);

/// How one delivery ended, as the `ruststream_outcomes_total` series name it (in the
/// order of `ALL`, which indexes the handles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ack,
    Drop,
    Retry,
    RetryAfter,
    /// The handler returned `Err`.
    Error,
    Panicked,
    TimedOut,
    Undecodable,
}

impl Outcome {
    const ALL: [Self; 8] = [
        Self::Ack,
        Self::Drop,
        Self::Retry,
        Self::RetryAfter,
        Self::Error,
        Self::Panicked,
        Self::TimedOut,
        Self::Undecodable,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Ack => "ack",
            Self::Drop => "drop",
            Self::Retry => "retry",
            Self::RetryAfter => "retry_after",
            Self::Error => "error",
            Self::Panicked => "panicked",
            Self::TimedOut => "timed_out",
            Self::Undecodable => "undecodable",
        }
    }

    /// The outcome of a handled delivery: what the handler answered (or why there was no
    /// answer), the same on every transport whatever the plan made of it. Dead letters
    /// are counted once confirmed, in `ruststream_copies_published_total{kind="dead_letter"}`.
    pub(crate) fn of(completion: &Completion) -> Self {
        match completion {
            Completion::Outcome(outcome) => match outcome.kind() {
                OutcomeKind::Ack => Self::Ack,
                OutcomeKind::Drop => Self::Drop,
                OutcomeKind::Retry { delay: None } => Self::Retry,
                OutcomeKind::Retry { delay: Some(_) } => Self::RetryAfter,
            },
            Completion::Failed(_) => Self::Error,
            Completion::Panicked(_) => Self::Panicked,
            Completion::TimedOut(_) => Self::TimedOut,
            Completion::Rejected(_) => Self::Undecodable,
        }
    }
}

/// A copy the runtime published and the broker confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Published {
    RetryCopy,
    DeadLetter,
}

/// Why a copy did not go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyFailure {
    /// Not confirmed in time or the connection dropped; it was tried again.
    Transient,
    /// The broker refused it; the original comes back later or is held.
    Refused,
    /// The broker refused it and nothing can bring the original back (Core NATS).
    Lost,
}

/// Why a settlement did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleError {
    /// The broker or the connection failed it.
    Failed,
    /// The transport cannot do it (`AckError::Unsupported`: a Core NATS ack, by design).
    Unsupported,
}

/// Every family of the app, registered once.
pub(crate) struct Metrics {
    registry: Mutex<Registry>,
    deliveries: Family<Labels, Counter>,
    outcomes: Family<KindLabels, Counter>,
    duration: Family<Labels, Histogram>,
    age: Family<Labels, Histogram>,
    batch_size: Family<Labels, Histogram>,
    in_flight: Family<Labels, Gauge>,
    delayed: Family<Labels, Gauge>,
    copies: Family<KindLabels, Counter>,
    copy_failures: Family<KindLabels, Counter>,
    settle_errors: Family<KindLabels, Counter>,
    fetch_errors: Family<Labels, Counter>,
    in_flight_sources: Mutex<Vec<(Gauge, Gauge, Arc<InFlight>)>>,
    running: Family<Labels, Gauge>,
    backlog: Family<BacklogLabels, Gauge>,
    backlog_probes: Mutex<Vec<(Labels, BacklogProbe)>>,
    clock: quanta::Clock,
    watches: Vec<Arc<dyn super::Watch>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Handler durations from 100 µs to about 100 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.5, 16))
}

/// Batch sizes from 1 to 4,096 (powers of two).
fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 13))
}

/// Delivery ages from 1 ms to about 15 min.
fn age_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.5, 16))
}

impl Metrics {
    pub(crate) fn new(watches: Vec<Arc<dyn super::Watch>>) -> Arc<Self> {
        let mut registry = Registry::default();
        let r = &mut registry;
        let deliveries = registered(r, &series::DELIVERIES, Family::default());
        let outcomes = registered(r, &series::OUTCOMES, Family::default());
        let duration = registered(
            r,
            &series::DURATION,
            Family::<Labels, Histogram>::new_with_constructor(
                duration_histogram as fn() -> Histogram,
            ),
        );
        let age = registered(
            r,
            &series::AGE,
            Family::<Labels, Histogram>::new_with_constructor(age_histogram as fn() -> Histogram),
        );
        let batch_size = registered(
            r,
            &series::BATCH_SIZE,
            Family::<Labels, Histogram>::new_with_constructor(batch_histogram as fn() -> Histogram),
        );
        let in_flight = registered(r, &series::IN_FLIGHT, Family::default());
        let running = registered(r, &series::RUNNING, Family::default());
        let delayed = registered(r, &series::DELAYED, Family::default());
        let copies = registered(r, &series::COPIES, Family::default());
        let copy_failures = registered(r, &series::COPY_FAILURES, Family::default());
        let settle_errors = registered(r, &series::SETTLE_ERRORS, Family::default());
        let fetch_errors = registered(r, &series::FETCH_ERRORS, Family::default());
        let backlog = registered(r, &series::BACKLOG, Family::default());
        Arc::new(Self {
            registry: Mutex::new(registry),
            deliveries,
            outcomes,
            duration,
            age,
            batch_size,
            in_flight,
            delayed,
            copies,
            copy_failures,
            settle_errors,
            fetch_errors,
            in_flight_sources: Mutex::default(),
            running,
            backlog,
            backlog_probes: Mutex::default(),
            // Calibrated once per app (against the system clock, a few milliseconds).
            clock: quanta::Clock::new(),
            watches,
        })
    }

    /// The handles of one registration, and its in-flight count, read at each scrape
    /// (the runtime keeps that count anyway: exposing it costs nothing per delivery).
    pub(crate) fn instruments(
        &self,
        registration: &str,
        address: &str,
        transport: &'static str,
        in_flight: Arc<InFlight>,
        backlog: Option<BacklogProbe>,
    ) -> Instruments {
        let labels = Labels {
            registration: registration.to_owned(),
            address: address.to_owned(),
            transport,
        };
        let kind = |kind: &'static str| KindLabels {
            registration: labels.registration.clone(),
            address: labels.address.clone(),
            transport,
            kind,
        };
        self.lock_in_flight().push((
            self.in_flight.get_or_create_owned(&labels),
            self.running.get_or_create_owned(&labels),
            in_flight,
        ));
        if let Some(probe) = backlog {
            self.backlog_probes
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((labels.clone(), probe));
        }
        Instruments {
            deliveries: self.deliveries.get_or_create_owned(&labels),
            outcomes: Outcome::ALL.map(|o| self.outcomes.get_or_create_owned(&kind(o.label()))),
            duration: self.duration.get_or_create_owned(&labels),
            age: self.age.get_or_create_owned(&labels),
            batch_size: self.batch_size.get_or_create_owned(&labels),
            delayed: self.delayed.get_or_create_owned(&labels),
            copies: [
                self.copies.get_or_create_owned(&kind("retry_copy")),
                self.copies.get_or_create_owned(&kind("dead_letter")),
            ],
            copy_failures: [
                self.copy_failures.get_or_create_owned(&kind("transient")),
                self.copy_failures.get_or_create_owned(&kind("refused")),
                self.copy_failures.get_or_create_owned(&kind("lost")),
            ],
            settle_errors: [
                self.settle_errors.get_or_create_owned(&kind("failed")),
                self.settle_errors.get_or_create_owned(&kind("unsupported")),
            ],
            fetch_errors: self.fetch_errors.get_or_create_owned(&labels),
            clock: self.clock.clone(),
        }
    }

    fn lock_in_flight(&self) -> MutexGuard<'_, Vec<(Gauge, Gauge, Arc<InFlight>)>> {
        self.in_flight_sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks every subscription's broker for its backlog (each within 3 s; a figure the
    /// broker does not tell keeps its last value).
    pub(crate) async fn refresh(&self) {
        let probes = self
            .backlog_probes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        // Asked all at once: a scrape waits for the slowest broker, not for their sum.
        let mut asked = tokio::task::JoinSet::new();
        for (labels, probe) in probes {
            let answer = probe();
            asked.spawn(
                async move { (labels, tokio::time::timeout(BACKLOG_TIMEOUT, answer).await) },
            );
        }
        while let Some(joined) = asked.join_next().await {
            let Ok((labels, answer)) = joined else {
                continue;
            };
            match answer {
                Ok(Ok(figures)) => {
                    for figure in figures {
                        let key = BacklogLabels {
                            registration: labels.registration.clone(),
                            address: labels.address.clone(),
                            transport: labels.transport,
                            kind: figure.kind,
                            partition: figure.partition.map(|p| p.to_string()).unwrap_or_default(),
                        };
                        self.backlog
                            .get_or_create(&key)
                            .set(i64::try_from(figure.value).unwrap_or(i64::MAX));
                    }
                }
                Ok(Err(error)) => tracing::debug!(
                    registration = labels.registration,
                    %error,
                    "the broker did not tell the backlog"
                ),
                Err(_) => tracing::debug!(
                    registration = labels.registration,
                    "the broker did not tell the backlog within 3 s"
                ),
            }
        }
    }

    /// The Prometheus text exposition of every series.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        {
            // Registrations that share a name and address share a series: their sum.
            let sources = self.lock_in_flight();
            for (total, running, _) in sources.iter() {
                total.set(0);
                running.set(0);
            }
            let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
            for (total, running, in_flight) in sources.iter() {
                total.inc_by(gauge(in_flight.total()));
                running.inc_by(gauge(in_flight.running()));
            }
        }
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        super::watches::encode(&mut out, &self.watches);
        out
    }
}

/// One registration's handles (clones of the series' own atomics).
#[derive(Clone)]
pub(crate) struct Instruments {
    pub(crate) deliveries: Counter,
    outcomes: [Counter; 8],
    pub(crate) duration: Histogram,
    age: Histogram,
    batch_size: Histogram,
    pub(crate) delayed: Gauge,
    copies: [Counter; 2],
    copy_failures: [Counter; 3],
    settle_errors: [Counter; 2],
    pub(crate) fetch_errors: Counter,
    /// Reads the CPU's time-stamp counter where it is steady (a few nanoseconds, against
    /// about twenty for the system clock), for the handler duration.
    pub(crate) clock: quanta::Clock,
}

impl Instruments {
    /// A point in time for [`Instruments::observe_since`].
    pub(crate) fn now(&self) -> u64 {
        self.clock.raw()
    }

    /// Observes the handler duration from `start` to now.
    pub(crate) fn observe_since(&self, start: u64) {
        let nanos = self.clock.delta_as_nanos(start, self.clock.raw());
        // Exact below 2^53 ns (104 days).
        #[allow(clippy::cast_precision_loss)]
        self.duration.observe(nanos as f64 / 1e9);
    }

    /// Observes how long ago the broker stamped the delivery (`timestamp_ms`), when it
    /// did: the time from publish to this attempt's handler call. A producer's clock
    /// ahead of this host's counts as 0.
    pub(crate) fn observe_age(&self, timestamp_ms: Option<i64>) {
        let Some(stamped) = timestamp_ms else {
            return;
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // Milliseconds, exact far past any age a backlog reaches.
        #[allow(clippy::cast_precision_loss)]
        self.age
            .observe(now.saturating_sub(stamped).max(0) as f64 / 1e3);
    }

    /// Observes the size of a batch handed to a batch handler.
    pub(crate) fn observe_batch(&self, size: usize) {
        // Exact far past any batch size.
        #[allow(clippy::cast_precision_loss)]
        self.batch_size.observe(size as f64);
    }

    pub(crate) fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].inc();
    }

    pub(crate) fn published(&self, copy: Published) {
        self.copies[copy as usize].inc();
    }

    pub(crate) fn copy_failed(&self, failure: CopyFailure) {
        self.copy_failures[failure as usize].inc();
    }

    pub(crate) fn settle_failed(&self, error: SettleError) {
        self.settle_errors[error as usize].inc();
    }
}

/// Registers `metric` as `name` with its help text, and hands it back.
fn registered<M: Metric + Clone>(registry: &mut Registry, series: &Series, metric: M) -> M {
    registry.register(series.name, series.help, metric.clone());
    metric
}

/// A series' name and the help text a scrape shows for it.
struct Series {
    name: &'static str,
    help: &'static str,
}

/// Every series the metrics expose.
mod series {
    use super::Series;

    pub(super) const DELIVERIES: Series = Series {
        name: "ruststream_deliveries",
        help: "Deliveries fetched from the broker",
    };

    pub(super) const OUTCOMES: Series = Series {
        name: "ruststream_outcomes",
        help: "Handled deliveries by what the handler answered (kind: ack, drop, retry, \
                 retry_after, error, panicked, timed_out, undecodable)",
    };

    pub(super) const AGE: Series = Series {
        name: "ruststream_delivery_age_seconds",
        help: "Time from the broker's timestamp of a delivery (its publish) to the handler's \
               call, where the broker stamps deliveries (Kafka, JetStream, Pulsar, Redis)",
    };

    pub(super) const DURATION: Series = Series {
        name: "ruststream_handler_duration_seconds",
        help: "Time from the handler's call to its answer (extractors included)",
    };

    pub(super) const BATCH_SIZE: Series = Series {
        name: "ruststream_batch_size",
        help: "Messages handed to a batch handler per call (batch registrations only)",
    };

    pub(super) const IN_FLIGHT: Series = Series {
        name: "ruststream_in_flight",
        help: "Deliveries fetched and not settled: running, queued for a lane, or waiting \
                 for a delayed copy",
    };

    pub(super) const RUNNING: Series = Series {
        name: "ruststream_running",
        help: "Of the deliveries in flight, those a handler runs for now (the rest of \
                 ruststream_in_flight minus ruststream_delayed is queued for a lane)",
    };

    pub(super) const DELAYED: Series = Series {
        name: "ruststream_delayed",
        help: "Deliveries whose retry copy waits for its delay in this process",
    };

    pub(super) const COPIES: Series = Series {
        name: "ruststream_copies_published",
        help: "Copies published and confirmed before their original settled (kind: \
                 retry_copy, dead_letter)",
    };

    pub(super) const COPY_FAILURES: Series = Series {
        name: "ruststream_copy_failures",
        help: "Copies that did not go out (kind: transient = tried again, refused = the \
                 original comes back later, lost = nothing can bring the original back)",
    };

    pub(super) const SETTLE_ERRORS: Series = Series {
        name: "ruststream_settle_errors",
        help: "Settlements that did not happen (kind: failed, unsupported)",
    };

    pub(super) const FETCH_ERRORS: Series = Series {
        name: "ruststream_fetch_errors",
        help: "Fetches from the broker that failed",
    };

    pub(super) const BACKLOG: Series = Series {
        name: "ruststream_backlog",
        help: "What the broker tells about the subscription's backlog, asked at each scrape \
                 (kind: pending = not yet delivered, Kafka high watermark - committed per \
                 partition and JetStream num_pending; ack_pending = delivered and not \
                 acknowledged, JetStream; slow_consumer_dropped = Core NATS messages the \
                 client dropped since the start)",
    };
}
