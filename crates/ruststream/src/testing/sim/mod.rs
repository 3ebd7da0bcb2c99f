//! Seeded fault schedules: a service's real [`App`] on the memory broker, fed its inputs
//! one step at a time while a seeded scheduler injects what the chosen broker may
//! legally do, with the service's own invariants checked after every step.
//!
//! Inputs go one at a time or, one group in four, two to four together (then as many
//! run at once as the registration lets, interleaving where they await); each step runs
//! until the app is idle, under tokio's paused clock on one thread, so a seed replays
//! exactly, interleavings included ([`Simulation::run`]). What a profile injects:
//!
//! | profile | besides delivering the next inputs |
//! |---|---|
//! | Kafka | a crash after some records were handled and before their offsets were committed: the service restarts and every record since the last commit comes again, in order (K5); the same after a crash while handlers run; a rebalance, the same records again without a restart; a producer's duplicate |
//! | JetStream, RabbitMQ, Redis Streams, Pulsar, memory | a crash after a handler finished and before its acknowledgement landed: the service restarts and the message comes again, as the next attempt where the broker counts (N, R, S, P); a crash while handlers run, after which the broker hands out again what was unsettled; a producer's duplicate |
//! | Core NATS | a message lost (at most once): never delivered; a crash while handlers run loses what was unsettled |
//! | every profile | the first publish while the inputs run refused, as by a broker gone away (`PublishErrorKind::Disconnected`) or as the broker's refusal of the message itself (`Rejected`), or never answered, as by a broker that stalls (the handler is then held past its deadline and cancelled): a handler's own publish, or the runtime's retry copy or dead letter |
//!
//! The simulated broker settles as the profile's transport does
//! ([`Profile::capabilities`]), so the runtime plans each outcome as it would there.
//!
//! A crash while handlers run lets the app's clock run a seeded 0 to 29 ms after the
//! inputs were published, then stops the app without waiting: each handler stops at the
//! await it was in, its writes so far kept. Inputs given with keys
//! ([`Simulation::keyed_inputs`]) of different keys may swap places, never two of one
//! key. See the guide's "Testing under faults".
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use ruststream::testing::sim::{Profile, Simulation};
//! use ruststream::{App, HandlerOutcome, Message, State, on};
//!
//! // The service's state: shared by the app's handlers and the invariants (a clone
//! // shares the map), kept across the restarts of one schedule as a database would.
//! #[derive(Clone, Default)]
//! struct Ledger(Arc<Mutex<HashMap<u64, u32>>>);
//!
//! // Charges an order each time it sees it: not idempotent.
//! async fn charge(Message(order): Message<u64>, State(ledger): State<Ledger>) -> HandlerOutcome {
//!     *ledger.0.lock().unwrap().entry(order).or_default() += 1;
//!     HandlerOutcome::ack()
//! }
//!
//! let sim = Simulation::new(Profile::JetStream, Ledger::default, |broker, ledger| {
//!     App::new().state(Ledger::clone(&ledger)).register(on(broker.topic("orders"), charge))
//! })
//! .inputs("orders", (0..20_u64).map(|n| serde_json::to_vec(&n).unwrap()))
//! .invariant("charged at most once", |ledger: &Ledger, _| {
//!     match ledger.0.lock().unwrap().iter().find(|(_, n)| **n > 1) {
//!         Some((order, n)) => Err(format!("order {order} charged {n} times")),
//!         None => Ok(()),
//!     }
//! });
//! let failure = sim.check(0..100).expect_err("a redelivery charges twice");
//! assert!(failure.to_string().contains("charged 2 times"));
//! // The same seed replays the same schedule.
//! assert_eq!(sim.run(failure.seed).unwrap_err().trace, failure.trace);
//! ```

mod schedule;

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use ruststream_core::{Capabilities, DelayedRedelivery, Verb};

use crate::app::App;
use crate::memory::{MemoryBroker, NATIVE, RUNTIME_RETRIES};

/// What the simulated broker may do besides delivering: one per transport's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Profile {
    /// Crash before the offsets of the last records were committed: they come again.
    Kafka,
    /// Crash before an acknowledgement landed: the message comes again.
    JetStream,
    /// As JetStream (a delivery unacknowledged when the channel dies comes back).
    RabbitMq,
    /// As JetStream (a pending entry is claimed again).
    Redis,
    /// As JetStream (an unacknowledged message comes back on reconnect).
    Pulsar,
    /// A message may be lost; nothing comes again.
    CoreNats,
    /// As JetStream.
    Memory,
}

impl Profile {
    /// What the simulated broker's topics say they can do: the transport's own
    /// capabilities (Kafka `Commit::Tracked`, a classic RabbitMQ queue, a Pulsar `Shared`
    /// subscription), so the runtime plans each outcome as it would there (copies where
    /// the broker cannot redeliver or delay, attempts in the retry-count header where it
    /// does not count). Two differ, as the memory broker cannot do their part: Redis and
    /// Pulsar dead letters are published by the runtime (Redis moves one in a single
    /// `MULTI`, Pulsar's client moves it). `ruststream-guide`'s `tests/profiles.rs` holds
    /// each to its transport.
    pub const fn capabilities(self) -> Capabilities {
        // The memory broker's own (a JetStream's) or Kafka's, changed where the
        // transport differs.
        match self {
            Self::Kafka => RUNTIME_RETRIES,
            Self::JetStream | Self::Memory => NATIVE,
            Self::RabbitMq => NATIVE
                .with_native_count(false)
                .with_delayed_redelivery(DelayedRedelivery::Unsupported)
                .with_positions_name_messages(false),
            Self::Redis => NATIVE.with_delayed_redelivery(DelayedRedelivery::Held { limit: None }),
            Self::Pulsar => NATIVE
                .with_drop(Verb::AsAck)
                .with_delayed_redelivery(DelayedRedelivery::Held { limit: None }),
            Self::CoreNats => Capabilities::NOTHING,
        }
    }
}

type Check<S> = Box<dyn Fn(&S, &MemoryBroker) -> Result<(), String> + Send + Sync>;

/// What makes the service's app over a broker and its state.
type MakeApp<S> = Box<dyn Fn(&MemoryBroker, Arc<S>) -> App + Send + Sync>;

/// A service's app, its state and inputs, and the invariants its schedules must keep.
pub struct Simulation<S> {
    profile: Profile,
    state: Box<dyn Fn() -> S + Send + Sync>,
    app: MakeApp<S>,
    address: String,
    inputs: Vec<Bytes>,
    /// Each input's key, when given ([`Simulation::keyed_inputs`]).
    keys: Vec<Option<Bytes>>,
    invariants: Vec<(String, Check<S>)>,
    finally: Vec<(String, Check<S>)>,
}

/// The steps a schedule took, one line each.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace(pub Vec<String>);

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, step) in self.0.iter().enumerate() {
            writeln!(f, "  {:>3}. {step}", i + 1)?;
        }
        Ok(())
    }
}

/// A schedule that broke an invariant: its seed (replay it with [`Simulation::run`]),
/// which invariant, why, and the steps up to there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The schedule's seed.
    pub seed: u64,
    /// The invariant's name.
    pub invariant: String,
    /// What the invariant said.
    pub why: String,
    /// The steps, the last one the step after which the invariant broke.
    pub trace: Trace,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {} broke `{}`: {}\nsteps:",
            self.seed, self.invariant, self.why
        )?;
        write!(f, "{}", self.trace)
    }
}

impl std::error::Error for Failure {}

impl<S: Send + Sync + 'static> Simulation<S> {
    /// A simulation under `profile` of the app `app` makes over a broker and the
    /// service's state; `state` makes that state afresh for each schedule (it outlives
    /// the app's restarts within one, as a database would).
    pub fn new(
        profile: Profile,
        state: impl Fn() -> S + Send + Sync + 'static,
        app: impl Fn(&MemoryBroker, Arc<S>) -> App + Send + Sync + 'static,
    ) -> Self {
        Self {
            profile,
            state: Box::new(state),
            app: Box::new(app),
            address: String::new(),
            inputs: Vec::new(),
            keys: Vec::new(),
            invariants: Vec::new(),
            finally: Vec::new(),
        }
    }

    /// The messages each schedule publishes to `address`, in order (payloads as the
    /// registration decodes them). Each carries `x-ruststream-id: m-<index>`.
    #[must_use]
    pub fn inputs(
        mut self,
        address: &str,
        payloads: impl IntoIterator<Item = impl Into<Bytes>>,
    ) -> Self {
        self.address = address.to_owned();
        self.inputs = payloads.into_iter().map(Into::into).collect();
        self.keys = vec![None; self.inputs.len()];
        self
    }

    /// Like [`inputs`](Self::inputs), each with a key: inputs of different keys may be
    /// delivered out of their order (never two of one key), as a broker ordering per
    /// key or partition may.
    #[must_use]
    pub fn keyed_inputs(
        mut self,
        address: &str,
        inputs: impl IntoIterator<Item = (impl Into<Bytes>, impl Into<Bytes>)>,
    ) -> Self {
        self.address = address.to_owned();
        (self.keys, self.inputs) = inputs
            .into_iter()
            .map(|(key, payload)| (Some(key.into()), payload.into()))
            .unzip();
        self
    }

    /// An invariant checked after every step, over the state and the broker (what the
    /// app published: [`MemoryBroker::published`] on a recording broker).
    #[must_use]
    pub fn invariant(
        mut self,
        name: &str,
        check: impl Fn(&S, &MemoryBroker) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.invariants.push((name.to_owned(), Box::new(check)));
        self
    }

    /// An invariant checked once every input was delivered and the app is idle.
    #[must_use]
    pub fn finally(
        mut self,
        name: &str,
        check: impl Fn(&S, &MemoryBroker) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        self.finally.push((name.to_owned(), Box::new(check)));
        self
    }

    /// Runs the schedules of `seeds` in order; the first failure, or how many ran.
    pub fn check(&self, seeds: Range<u64>) -> Result<u64, Failure> {
        let count = seeds.end.saturating_sub(seeds.start);
        for seed in seeds {
            self.run(seed)?;
        }
        Ok(count)
    }

    /// Runs the schedule of `seed` (on a runtime of its own, its clock paused): its
    /// steps, or how it broke an invariant. The same seed gives the same steps.
    ///
    /// # Panics
    ///
    /// Inside another tokio runtime (the simulation owns its own), or when the app
    /// does not start.
    pub fn run(&self, seed: u64) -> Result<Trace, Failure> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a runtime for the simulation");
        runtime.block_on(async {
            let _seeded = crate::seeded::schedule(seed);
            self.schedule(seed).await
        })
    }
}
