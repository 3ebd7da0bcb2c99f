//! Seeded fault schedules: a service's real [`App`] on the memory broker, fed its inputs
//! one step at a time while a seeded scheduler injects what the chosen broker may
//! legally do, with the service's own invariants checked after every step.
//!
//! This first form runs **sequential** schedules: one input (or one fault) per step,
//! each step run until the app is idle, under tokio's paused clock. With one message in
//! flight at a time the run does not depend on how tasks interleave, so a seed replays
//! exactly ([`Simulation::run`]). What a profile injects:
//!
//! | profile | besides delivering the next input |
//! |---|---|
//! | Kafka | a crash after some records were handled and before their offsets were committed: the service restarts and every record since the last commit comes again, in order (K5); a rebalance, the same records again without a restart; a producer's duplicate |
//! | JetStream, RabbitMQ, Redis Streams, Pulsar, memory | a crash after a handler finished and before its acknowledgement landed: the service restarts and the message comes again as the next attempt (N, R, S, P); a producer's duplicate |
//! | Core NATS | a message lost (at most once, N-Core): never delivered |
//! | every profile | the first publish while an input runs refused, as by a broker gone away (`PublishErrorKind::Disconnected`), or never answered, as by a broker that stalls (the handler is then held past its deadline and cancelled): a handler's own publish, or the runtime's retry copy or dead letter |
//!
//! Inputs given with keys ([`Simulation::keyed_inputs`]) of different keys may swap
//! places, never two of one key. Not yet: several messages in flight at once (a
//! rebalance in the middle of a batch) and permanent refusals; see the guide's "Testing
//! under faults".
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

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use ruststream_core::{MESSAGE_ID_HEADER, Outgoing};

use super::TestApp;
use crate::app::App;
use crate::memory::MemoryBroker;

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

/// One step of a schedule, besides delivering the next input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Deliver,
    /// Core NATS: the input is never delivered.
    Lose,
    /// A crash before the input's settlement landed (at least once).
    Crash,
    /// The producer publishes the input twice (at least once).
    Duplicate,
    /// The first publish while the input runs is refused.
    Refuse,
    /// Kafka: the partition moves; its next owner reads from the last commit (K5).
    Rebalance,
    /// The first publish while the input runs never answers: the handler is held past
    /// its deadline.
    Stall,
}

/// A small seeded generator (xorshift64* over a splitmix start): the only source of
/// choices in a schedule.
struct Draw(u64);

impl Draw {
    fn new(seed: u64) -> Self {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    /// A number below `n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

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

    /// The order the inputs go in: theirs, but for neighbours of different keys the
    /// scheduler swaps (one pair in eight).
    fn order(&self, draw: &mut Draw, trace: &mut Trace) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.inputs.len()).collect();
        let mut i = 0;
        while i + 1 < order.len() {
            let (a, b) = (order[i], order[i + 1]);
            let keyed = self.keys[a].is_some() && self.keys[b].is_some();
            if keyed && self.keys[a] != self.keys[b] && draw.below(8) == 0 {
                order.swap(i, i + 1);
                trace
                    .0
                    .push(format!("#{b} goes before #{a} (different keys)"));
                i += 1;
            }
            i += 1;
        }
        order
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
        runtime.block_on(self.schedule(seed))
    }

    async fn schedule(&self, seed: u64) -> Result<Trace, Failure> {
        let mut draw = Draw::new(seed);
        let mut trace = Trace::default();
        let broker = MemoryBroker::recording();
        let state = Arc::new((self.state)());
        let mut test = self.start(&broker, &state).await;
        // Kafka: inputs delivered since the last commit, which a crash brings back.
        let mut uncommitted: Vec<usize> = Vec::new();
        let at_least_once = self.profile != Profile::CoreNats;
        for index in self.order(&mut draw, &mut trace) {
            let step = match draw.below(8) {
                0 | 1 if !at_least_once => Step::Lose,
                0 | 1 => Step::Crash,
                2 if at_least_once => Step::Duplicate,
                3 => Step::Refuse,
                4 if self.profile == Profile::Kafka => Step::Rebalance,
                5 => Step::Stall,
                _ => Step::Deliver,
            };
            if step == Step::Lose {
                trace.0.push(format!("#{index} lost (at most once)"));
                self.checked(seed, &trace, &state, &broker, &self.invariants)?;
                continue;
            }
            if step == Step::Refuse {
                broker.refuse_next(1);
            }
            if step == Step::Stall {
                broker.stall_next(1);
            }
            self.deliver(&test, index, 0).await;
            broker.refuse_next(0);
            broker.stall_next(0);
            trace.0.push(match step {
                Step::Refuse => format!(
                    "deliver #{index}; the first publish while it runs refused (broker away)"
                ),
                Step::Stall => format!(
                    "deliver #{index}; the first publish while it runs never answers (held past its deadline)"
                ),
                _ => format!("deliver #{index}"),
            });
            uncommitted.push(index);
            self.checked(seed, &trace, &state, &broker, &self.invariants)?;
            match step {
                Step::Crash => {
                    test = self
                        .crash(test, &broker, &state, &mut uncommitted, &mut trace)
                        .await;
                }
                Step::Rebalance => {
                    for &i in &uncommitted {
                        self.deliver(&test, i, 1).await;
                    }
                    let list: Vec<String> = uncommitted.iter().map(|i| format!("#{i}")).collect();
                    trace.0.push(format!(
                        "rebalance: the partition's next owner reads from the last commit: {} again",
                        list.join(", ")
                    ));
                    uncommitted.clear();
                }
                Step::Duplicate => {
                    self.deliver(&test, index, 0).await;
                    trace.0.push(format!(
                        "#{index} published again by its producer (a duplicate)"
                    ));
                }
                _ if self.profile == Profile::Kafka && draw.below(3) == 0 => {
                    uncommitted.clear();
                    trace.0.push("offsets committed".to_owned());
                }
                _ => continue,
            }
            self.checked(seed, &trace, &state, &broker, &self.invariants)?;
        }
        test.idle(std::time::Duration::from_secs(1)).await;
        trace.0.push("idle".to_owned());
        self.checked(seed, &trace, &state, &broker, &self.finally)?;
        test.stop().await;
        Ok(trace)
    }

    /// A crash before the settlement of the last input landed: the service restarts and
    /// what the broker still holds comes again as its next attempt (Kafka: everything
    /// since the last commit, in order).
    async fn crash(
        &self,
        test: TestApp,
        broker: &MemoryBroker,
        state: &Arc<S>,
        uncommitted: &mut Vec<usize>,
        trace: &mut Trace,
    ) -> TestApp {
        test.stop().await;
        let test = self.start(broker, state).await;
        let again: Vec<usize> = if self.profile == Profile::Kafka {
            std::mem::take(uncommitted)
        } else {
            uncommitted.pop().into_iter().collect()
        };
        uncommitted.clear();
        for &i in &again {
            self.deliver(&test, i, 1).await;
        }
        let list: Vec<String> = again.iter().map(|i| format!("#{i}")).collect();
        trace.0.push(format!(
            "crash before {} settled; restarted; {} delivered again",
            list.join(", "),
            list.join(", ")
        ));
        test
    }

    async fn start(&self, broker: &MemoryBroker, state: &Arc<S>) -> TestApp {
        let app = (self.app)(broker, Arc::clone(state));
        TestApp::start(app, broker)
            .await
            .unwrap_or_else(|e| panic!("the simulated app does not start: {e}"))
    }

    /// Publishes input `index` (a redelivery counted as delivered `earlier` times, as the
    /// broker would count it) and runs until the app is idle.
    async fn deliver(&self, test: &TestApp, index: usize, earlier: u32) {
        let mut message = Outgoing::new(self.address.clone(), self.inputs[index].clone());
        message.key.clone_from(&self.keys[index]);
        message
            .headers
            .insert(MESSAGE_ID_HEADER, format!("m-{index}"));
        test.broker().publish_counted(message, earlier).await;
        test.idle(std::time::Duration::from_secs(1)).await;
    }

    fn checked(
        &self,
        seed: u64,
        trace: &Trace,
        state: &S,
        broker: &MemoryBroker,
        checks: &[(String, Check<S>)],
    ) -> Result<(), Failure> {
        for (name, check) in checks {
            if let Err(why) = check(state, broker) {
                return Err(Failure {
                    seed,
                    invariant: name.clone(),
                    why,
                    trace: trace.clone(),
                });
            }
        }
        Ok(())
    }
}
