//! What an operator sees of a running app: Prometheus metrics and the health endpoints.
//!
//! Turned on with [`App::ops`](crate::App::ops) (serves on `127.0.0.1`) or
//! [`App::ops_on`](crate::App::ops_on) (any address, an explicit choice), or
//! [`App::metrics`](crate::App::metrics) to collect without serving. Off, the runtime
//! pays one branch per delivery for it.
//!
//! | path | answers |
//! |---|---|
//! | `/metrics` | every series below, Prometheus text format |
//! | `/health/live` | `200` while the process runs |
//! | `/health/ready` | `200` once every subscription is open, its connection up (NATS: the client's connection state; Kafka: a broker answers a metadata request within 2 s; Pulsar: no probe) and no fetch failed in the last 3 s; `503` with the reasons otherwise, and from the moment a stop is asked (drain) |
//!
//! Series (labels `registration`, `address`, `transport`; `kind` where named):
//!
//! | series | what |
//! |---|---|
//! | `ruststream_deliveries_total` | deliveries fetched |
//! | `ruststream_outcomes_total{kind}` | attempts by what the handler answered, the same on every transport: `ack`, `drop`, `retry`, `retry_after`, `error` (the handler returned `Err`), `panicked`, `timed_out`, `undecodable` (the payload did not decode; it counts so whatever the failure policy makes of it) |
//! | `ruststream_handler_duration_seconds` | histogram, from the call (extractors included) to the answer |
//! | `ruststream_delivery_age_seconds` | histogram, from the broker's timestamp of the delivery (its publish; Kafka, JetStream, Pulsar, Redis) to each attempt's handler call: the publish-to-handle latency, backlog waits included. Clocks of other hosts count: a producer's clock ahead reads as 0 |
//! | `ruststream_in_flight` | what counts toward `max_in_flight`: fetched and not settled (running, queued for a lane, waiting for a delayed copy), and held by the subscription through a `retry_after` wait (Pulsar, RabbitMQ quorum, Redis) |
//! | `ruststream_running` | of those, a handler runs for now |
//! | `ruststream_delayed` | of those, waiting in this process for a delayed retry copy (the rest, `in_flight - running - delayed`, is queued for a lane or held by the subscription) |
//! | `ruststream_copies_published_total{kind}` | `retry_copy`, `dead_letter`: published and confirmed before the original settled; a dead letter the subscription moves in one step (Redis) counts here too, once confirmed. Pulsar's dead letters are written by the client's own policy, out of the runtime's sight: not counted |
//! | `ruststream_copy_failures_total{kind}` | `transient` (tried again), `refused` (the original comes back later or is held), `lost` (nothing can bring the original back: Core NATS) |
//! | `ruststream_settle_errors_total{kind}` | `failed` (the broker or connection failed it), `unsupported` (the transport has no such operation, e.g. every Core NATS ack, by design) |
//! | `ruststream_fetch_errors_total` | fetches that failed (a broker down shows here) |
//! | `ruststream_backlog{kind, partition}` | asked of the broker at each scrape: `pending` (Kafka: high watermark − committed, per partition; JetStream: `num_pending`), `ack_pending` (JetStream: delivered, not acknowledged), `slow_consumer_dropped` (Core NATS: at least this many messages the client dropped for the subscription since the start; see below). Redis: `pending` (`XINFO GROUPS` `lag`) and `ack_pending` (the group's pending entries). RabbitMQ: `pending` (the queue's ready messages). Pulsar: none yet (the client does not expose the backlog; the broker's admin API does) |
//!
//! Beside these, every [`Watch`] the app was given ([`App::watch`](crate::App::watch))
//! adds its own series at each scrape and its reasons to `/health/ready`:
//! `ruststream-sql`'s inbox (`ruststream_inbox_skipped_total`) and outbox relay
//! (`ruststream_outbox_unsent`, `ruststream_outbox_oldest_unsent_seconds`, not ready past
//! its `max_lag`).
//!
//! What to alert on is in the README ("Operating a service").

mod metrics;
mod server;
mod watches;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ruststream_core::LinkProbe;
use tokio::sync::watch;

pub(crate) use metrics::{CopyFailure, Instruments, Metrics, Outcome, Published, SettleError};
pub(crate) use server::serve;
pub use watches::{Reading, Watch};

/// What the readiness check reads.
pub(crate) struct Health {
    stop: watch::Receiver<bool>,
    started: AtomicBool,
    subscriptions: Mutex<Vec<Arc<SubscriptionHealth>>>,
    watches: Vec<Arc<dyn Watch>>,
}

/// One subscription's part of readiness, updated by its driver.
pub(crate) struct SubscriptionHealth {
    registration: Arc<str>,
    address: String,
    link: Option<LinkProbe>,
    /// When a fetch last failed, in milliseconds after `since` (0: never, or it worked
    /// since).
    fetch_failed_at: AtomicU64,
    since: Instant,
    ended: AtomicBool,
}

/// A fetch failure counts against readiness this long: while a broker is away the
/// driver's fetches fail every 200 ms, and once they stop failing the subscription is
/// ready again even if nothing arrives to fetch.
const FETCH_FAILURE_COUNTS: Duration = Duration::from_secs(3);

impl SubscriptionHealth {
    pub(crate) fn fetch_failed(&self, failing: bool) {
        let at = if failing {
            u64::try_from(self.since.elapsed().as_millis())
                .unwrap_or(u64::MAX)
                .max(1)
        } else {
            0
        };
        self.fetch_failed_at.store(at, Ordering::Relaxed);
    }

    fn fetch_failing(&self) -> bool {
        match self.fetch_failed_at.load(Ordering::Relaxed) {
            0 => false,
            at => {
                self.since
                    .elapsed()
                    .saturating_sub(Duration::from_millis(at))
                    < FETCH_FAILURE_COUNTS
            }
        }
    }

    pub(crate) fn ended(&self) {
        self.ended.store(true, Ordering::Relaxed);
    }
}

impl Health {
    pub(crate) fn new(stop: watch::Receiver<bool>, watches: Vec<Arc<dyn Watch>>) -> Arc<Self> {
        Arc::new(Self {
            stop,
            started: AtomicBool::new(false),
            subscriptions: Mutex::default(),
            watches,
        })
    }

    pub(crate) fn add(
        &self,
        registration: Arc<str>,
        address: String,
        link: Option<LinkProbe>,
    ) -> Arc<SubscriptionHealth> {
        let health = Arc::new(SubscriptionHealth {
            registration,
            address,
            link,
            fetch_failed_at: AtomicU64::new(0),
            since: Instant::now(),
            ended: AtomicBool::new(false),
        });
        self.subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&health));
        health
    }

    /// Every subscription is open.
    pub(crate) fn started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// Why the app is not ready; empty when it is. Link probes may block briefly (a
    /// metadata request): call this off the async threads.
    pub(crate) fn not_ready(&self) -> Vec<String> {
        let mut reasons = Vec::new();
        if *self.stop.borrow() {
            reasons.push("stopping: draining and closing".to_owned());
        }
        if !self.started.load(Ordering::Relaxed) {
            reasons.push("starting: not every subscription is open yet".to_owned());
        }
        let subscriptions = self
            .subscriptions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for s in subscriptions {
            let name = |what: &str| {
                format!(
                    "registration `{}` on `{}`: {what}",
                    s.registration, s.address
                )
            };
            if s.ended.load(Ordering::Relaxed) {
                reasons.push(name("its subscription ended"));
            } else if s.link.as_ref().is_some_and(|up| !up()) {
                reasons.push(name("its connection to the broker is down"));
            } else if s.fetch_failing() {
                reasons.push(name("fetching from the broker failed in the last seconds"));
            }
        }
        reasons.extend(self.watches.iter().filter_map(|w| w.not_ready()));
        reasons
    }
}

/// What the endpoint serves.
pub(crate) struct Ops {
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) health: Arc<Health>,
    /// The service's description (`/asyncapi.json`, `/asyncapi.yaml`, `/asyncapi`).
    pub(crate) asyncapi: crate::asyncapi::Served,
}
