//! One schedule: the inputs in groups (one, or a few published together so that they
//! run at once where the registration lets them), each group with the step the seed
//! draws for it, the invariants checked after every step.

use std::sync::Arc;
use std::time::Duration;

use ruststream_core::{MESSAGE_ID_HEADER, Outgoing};

use super::{Check, Failure, Profile, Simulation, Trace};
use crate::memory::MemoryBroker;
use crate::testing::TestApp;

/// How long a step waits, at most, between two looks at whether the app is idle.
const LONGEST_LOOK: Duration = Duration::from_secs(1);

/// What happens to a group of inputs besides their delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Deliver,
    /// Core NATS: the inputs are never delivered.
    Lose,
    /// A crash once the group was handled, before its settlements landed (at least
    /// once): they come again after the restart.
    Crash,
    /// A crash while the group runs: running handlers stop where they are, and what was
    /// unsettled comes again by the broker's rule (lost on Core NATS).
    Kill,
    /// The producer publishes one of the inputs twice (at least once).
    Duplicate,
    /// The first publish while the group runs is refused as by a broker gone away.
    Refuse,
    /// The first publish while the group runs is refused for good (`Rejected`): the
    /// broker refuses the message itself.
    Reject,
    /// Kafka: the partition moves; its next owner reads from the last commit (K5).
    Rebalance,
    /// The first publish while the group runs never answers: its handler is held past
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

/// One schedule in progress.
struct Run<'s, S> {
    sim: &'s Simulation<S>,
    seed: u64,
    draw: Draw,
    trace: Trace,
    broker: MemoryBroker,
    state: Arc<S>,
    /// The app, but between a crash and its restart.
    test: Option<TestApp>,
    /// Kafka: inputs delivered since the last commit, which a crash brings back.
    uncommitted: Vec<usize>,
    /// How many inputs the last group delivered.
    last_group: usize,
}

fn names(group: &[usize]) -> String {
    let names: Vec<String> = group.iter().map(|i| format!("#{i}")).collect();
    names.join(", ")
}

impl<S: Send + Sync + 'static> Simulation<S> {
    pub(super) async fn schedule(&self, seed: u64) -> Result<Trace, Failure> {
        let broker = MemoryBroker::recording();
        broker.pose_as(self.profile.capabilities());
        let state = Arc::new((self.state)());
        let test = Some(self.start(&broker, &state).await);
        let mut run = Run {
            sim: self,
            seed,
            draw: Draw::new(seed),
            trace: Trace::default(),
            broker,
            state,
            test,
            uncommitted: Vec::new(),
            last_group: 0,
        };
        let order = run.order();
        let mut at = 0;
        while at < order.len() {
            // One group in four is a burst of 2 to 4 inputs published together.
            let size = match run.draw.below(4) {
                0 => 2 + usize::try_from(run.draw.below(3)).unwrap_or(0),
                _ => 1,
            };
            let group = &order[at..(at + size).min(order.len())];
            at += group.len();
            run.group(group).await?;
        }
        run.idle().await;
        run.trace.0.push("idle".to_owned());
        run.checked(&self.finally)?;
        run.stop().await;
        Ok(run.trace)
    }

    /// The app over `broker`, started; a stop is a crash (running handlers are not
    /// waited for).
    async fn start(&self, broker: &MemoryBroker, state: &Arc<S>) -> TestApp {
        let app = (self.app)(broker, Arc::clone(state)).shutdown_timeout(Duration::ZERO);
        TestApp::start(app, broker)
            .await
            .unwrap_or_else(|e| panic!("the simulated app does not start: {e}"))
    }
}

impl<S: Send + Sync + 'static> Run<'_, S> {
    /// The order the inputs go in: theirs, but for neighbours of different keys the
    /// scheduler swaps (one pair in eight).
    fn order(&mut self) -> Vec<usize> {
        let keys = &self.sim.keys;
        let mut order: Vec<usize> = (0..self.sim.inputs.len()).collect();
        let mut i = 0;
        while i + 1 < order.len() {
            let (a, b) = (order[i], order[i + 1]);
            let keyed = keys[a].is_some() && keys[b].is_some();
            if keyed && keys[a] != keys[b] && self.draw.below(8) == 0 {
                order.swap(i, i + 1);
                self.trace
                    .0
                    .push(format!("#{b} goes before #{a} (different keys)"));
                i += 1;
            }
            i += 1;
        }
        order
    }

    fn step(&mut self) -> Step {
        let profile = self.sim.profile;
        let at_least_once = profile != Profile::CoreNats;
        match self.draw.below(10) {
            0 | 1 if !at_least_once => Step::Lose,
            0 | 1 => Step::Crash,
            2 if at_least_once => Step::Duplicate,
            3 => Step::Refuse,
            4 if profile == Profile::Kafka => Step::Rebalance,
            5 => Step::Stall,
            6 => Step::Reject,
            7 => Step::Kill,
            _ => Step::Deliver,
        }
    }

    async fn group(&mut self, group: &[usize]) -> Result<(), Failure> {
        let step = self.step();
        let list = names(group);
        if step == Step::Lose {
            self.trace.0.push(format!("{list} lost (at most once)"));
            return self.checked(&self.sim.invariants);
        }
        if step == Step::Kill {
            return self.kill(group).await;
        }
        let refuse = matches!(step, Step::Refuse | Step::Reject);
        self.broker.refuse_next(u32::from(refuse));
        self.broker.refuse_for_good(step == Step::Reject);
        self.broker.stall_next(u32::from(step == Step::Stall));
        for &index in group {
            self.publish(index, 0).await;
        }
        self.idle().await;
        let unused = if self.broker.faults_unused() {
            " (no publish was made)"
        } else {
            ""
        };
        self.broker.refuse_next(0);
        self.broker.stall_next(0);
        self.trace.0.push(match step {
            Step::Refuse => {
                format!("deliver {list}; the first publish while it runs refused (broker away){unused}")
            }
            Step::Stall => format!(
                "deliver {list}; the first publish while it runs never answers (held past its deadline){unused}"
            ),
            Step::Reject => format!(
                "deliver {list}; the first publish while it runs rejected for good (`Rejected`){unused}"
            ),
            _ => format!("deliver {list}"),
        });
        self.uncommitted.extend_from_slice(group);
        self.last_group = group.len();
        self.checked(&self.sim.invariants)?;
        self.after(step, group).await
    }

    /// What follows a group's delivery: a crash, a rebalance, a duplicate, or (Kafka)
    /// now and then a commit.
    async fn after(&mut self, step: Step, group: &[usize]) -> Result<(), Failure> {
        match step {
            Step::Crash => self.crash().await,
            Step::Rebalance => {
                // Read again, and still not committed.
                let again = self.uncommitted.clone();
                for &i in &again {
                    self.publish(i, 1).await;
                }
                self.idle().await;
                self.trace.0.push(format!(
                    "rebalance: the partition's next owner reads from the last commit: {} again",
                    names(&again)
                ));
            }
            Step::Duplicate => {
                let index =
                    group[usize::try_from(self.draw.below(group.len() as u64)).unwrap_or(0)];
                self.publish(index, 0).await;
                if self.sim.profile == Profile::Kafka {
                    // Another record in the partition, read again by a crash too.
                    self.uncommitted.push(index);
                }
                self.idle().await;
                self.trace.0.push(format!(
                    "#{index} published again by its producer (a duplicate)"
                ));
            }
            _ if self.sim.profile == Profile::Kafka && self.draw.below(3) == 0 => {
                self.uncommitted.clear();
                self.trace.0.push("offsets committed".to_owned());
            }
            _ => return Ok(()),
        }
        self.checked(&self.sim.invariants)
    }

    /// A crash once the last group was handled, before its settlements landed: the
    /// service restarts and what the broker still holds comes again as its next attempt
    /// (Kafka: everything since the last commit, in order).
    async fn crash(&mut self) {
        self.stop().await;
        self.start().await;
        let mut again = std::mem::take(&mut self.uncommitted);
        if self.sim.profile == Profile::Kafka {
            // Read again, and still not committed.
            self.uncommitted.clone_from(&again);
        } else {
            // The last group's settlements had not landed; earlier ones had.
            again.drain(..again.len().saturating_sub(self.last_group));
        }
        for &i in &again {
            self.publish(i, 1).await;
        }
        self.idle().await;
        let list = names(&again);
        self.trace.0.push(format!(
            "crash before {list} settled; restarted; {list} delivered again"
        ));
    }

    /// A crash while `group` runs: after a seeded wait of up to 30 ms of the app's time
    /// (handlers that await are caught part way), the app stops without waiting for its
    /// handlers. What was unsettled comes again by the broker's rule: the broker's own
    /// redelivery (JetStream, RabbitMQ, Redis, Pulsar, memory); everything since the last
    /// commit, in order (Kafka); nothing (Core NATS).
    async fn kill(&mut self, group: &[usize]) -> Result<(), Failure> {
        let after = Duration::from_millis(self.draw.below(30));
        for &index in group {
            self.publish(index, 0).await;
        }
        tokio::time::sleep(after).await;
        self.uncommitted.extend_from_slice(group);
        let list = names(group);
        let profile = self.sim.profile;
        self.stop().await;
        if matches!(profile, Profile::Kafka | Profile::CoreNats) {
            // The inputs the closing consumer put back (or never took): Kafka reads
            // them again from the last commit, below; Core NATS loses them. What the app
            // published there itself (a retry copy) stays.
            self.broker.purge_ready(&self.sim.address, |headers| {
                headers.retry_count().ok().flatten().is_none()
                    && headers
                        .get_str(MESSAGE_ID_HEADER)
                        .is_some_and(|id| id.starts_with("m-"))
            });
        }
        self.start().await;
        let again = match profile {
            // Read again, and still not committed.
            Profile::Kafka => self.uncommitted.clone(),
            _ => {
                self.uncommitted.clear();
                Vec::new()
            }
        };
        for &i in &again {
            self.publish(i, 1).await;
        }
        self.idle().await;
        self.trace.0.push(match profile {
            Profile::Kafka => format!(
                "deliver {list}; crash {after:?} in, handlers cut short; restarted; {} read again from the last commit",
                names(&again)
            ),
            Profile::CoreNats => format!(
                "deliver {list}; crash {after:?} in, handlers cut short; restarted; what was unsettled is lost"
            ),
            _ => format!(
                "deliver {list}; crash {after:?} in, handlers cut short; restarted; the broker delivers what was unsettled again"
            ),
        });
        self.checked(&self.sim.invariants)
    }

    /// Stops the app: a crash (running handlers are not waited for).
    async fn stop(&mut self) {
        if let Some(test) = self.test.take() {
            test.stop().await;
        }
    }

    async fn start(&mut self) {
        self.test = Some(self.sim.start(&self.broker, &self.state).await);
    }

    async fn idle(&self) {
        if let Some(test) = &self.test {
            test.idle(LONGEST_LOOK).await;
        }
    }

    /// Publishes input `index` (a redelivery counted as delivered `earlier` times, as the
    /// broker would count it).
    async fn publish(&self, index: usize, earlier: u32) {
        let sim = self.sim;
        let mut message = Outgoing::new(sim.address.clone(), sim.inputs[index].clone());
        message.key.clone_from(&sim.keys[index]);
        message
            .headers
            .insert(MESSAGE_ID_HEADER, format!("m-{index}"));
        self.broker.publish_counted(message, earlier).await;
    }

    fn checked(&self, checks: &[(String, Check<S>)]) -> Result<(), Failure> {
        for (name, check) in checks {
            if let Err(why) = check(&self.state, &self.broker) {
                return Err(Failure {
                    seed: self.seed,
                    invariant: name.clone(),
                    why,
                    trace: self.trace.clone(),
                });
            }
        }
        Ok(())
    }
}
