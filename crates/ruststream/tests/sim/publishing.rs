//! Publishes under faults: refused (transient or for good), stalled past the deadline,
//! and copies the broker never confirms.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Message, State, on};

use crate::support::{AT_LEAST_ONCE, orders};

/// Confirms each order by publishing; `careful` handlers retry when the publish is
/// refused, the others ignore the refusal.
async fn confirm(
    Message(order): Message<u64>,
    publisher: ruststream::Publisher,
    State(careful): State<bool>,
) -> HandlerOutcome {
    match publisher.to("confirmations").send(&order).await {
        Ok(()) => HandlerOutcome::ack(),
        Err(_) if *careful => HandlerOutcome::retry(),
        Err(_) => HandlerOutcome::ack(),
    }
}

fn confirming(careful: bool) -> Simulation<()> {
    Simulation::new(
        Profile::JetStream,
        || (),
        move |broker, _| {
            App::new()
                .state(careful)
                .register(on(broker.topic("orders"), confirm))
        },
    )
    .inputs("orders", orders(20))
    .finally("every order confirmed", |_, broker| {
        let sent: HashSet<u64> = broker
            .published("confirmations")
            .iter()
            .filter_map(|m| serde_json::from_slice(&m.payload).ok())
            .collect();
        match (0..20).find(|order| !sent.contains(order)) {
            Some(order) => Err(format!("order {order} never confirmed")),
            None => Ok(()),
        }
    })
}

#[test]
fn a_refused_publish_the_handler_ignores_is_caught() {
    let failure = confirming(false)
        .check(0..1_000)
        .expect_err("a lost confirmation");
    assert!(failure.why.contains("never confirmed"), "{failure}");
    assert!(
        failure.to_string().contains("refused (broker away)"),
        "{failure}"
    );
    confirming(true)
        .check(0..1_000)
        .expect("retrying on a refusal confirms every order");
}

/// A publish that never answers holds the handler past its deadline: it is cancelled
/// and runs again, so what it did before the publish happens twice unless deduplicated.
#[test]
fn a_stalled_publish_holds_the_handler_past_its_deadline_and_it_runs_again() {
    #[derive(Clone, Default)]
    struct Work(Arc<Mutex<HashMap<u64, u32>>>);
    async fn work(
        Message(order): Message<u64>,
        publisher: ruststream::Publisher,
        State(done): State<Work>,
    ) -> HandlerOutcome {
        *done.0.lock().unwrap().entry(order).or_default() += 1;
        match publisher.to("confirmations").send(&order).await {
            Ok(()) => HandlerOutcome::ack(),
            Err(_) => HandlerOutcome::retry(),
        }
    }
    let sim = Simulation::new(Profile::RabbitMq, Work::default, |broker, done| {
        App::new()
            .state(Work::clone(&done))
            .register(on(broker.topic("orders"), work).timeout(std::time::Duration::from_secs(2)))
    })
    .inputs("orders", orders(20))
    .invariant("worked once", |done: &Work, _| {
        match done.0.lock().unwrap().iter().find(|(_, n)| **n > 1) {
            Some((order, n)) => Err(format!("order {order} worked {n} times")),
            None => Ok(()),
        }
    });
    // Among the failing seeds, one whose last step is the stall itself.
    let stalled = (0..1_000)
        .filter_map(|seed| sim.run(seed).err())
        .find(|f| {
            f.trace
                .0
                .last()
                .is_some_and(|step| step.contains("never answers"))
        })
        .expect("a stall that runs the handler again");
    assert!(stalled.why.contains("worked 2 times"), "{stalled}");
}

/// A retry copy or dead letter the broker never confirms is given up after
/// `COPY_CONFIRM_TIMEOUT` a try (it was waited for for ever: the simulation found it),
/// and every poison message still reaches the dead letter, nothing else does.
#[test]
fn a_copy_the_broker_never_confirms_holds_nothing_for_ever() {
    async fn handle(Message(n): Message<u64>) -> HandlerOutcome {
        if n % 7 == 3 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    }
    async fn dead(Message(_): Message<u64>) -> HandlerOutcome {
        HandlerOutcome::ack()
    }
    let dead_letters = |broker: &ruststream::memory::MemoryBroker| -> Vec<u64> {
        broker
            .published("orders.dead")
            .iter()
            .map(|m| serde_json::from_slice(&m.payload).expect("json"))
            .collect()
    };
    for profile in AT_LEAST_ONCE {
        Simulation::new(
            profile,
            || (),
            |broker, _| {
                App::new()
                    .register(
                        on(broker.topic("orders"), handle)
                            .max_attempts(3)
                            .dead_letter("orders.dead"),
                    )
                    .register(on(broker.topic("orders.dead"), dead))
            },
        )
        .inputs("orders", orders(30))
        .finally(
            "only poison dead-lettered",
            move |_, broker| match dead_letters(broker).into_iter().find(|n| n % 7 != 3) {
                Some(n) => Err(format!("{n} dead-lettered")),
                None => Ok(()),
            },
        )
        .finally("every poison dead-lettered", move |_, broker| {
            let dead = dead_letters(broker);
            match (0..30).filter(|n| n % 7 == 3).find(|n| !dead.contains(n)) {
                Some(n) => Err(format!("{n} never dead-lettered: {dead:?}")),
                None => Ok(()),
            }
        })
        .check(0..300)
        .unwrap_or_else(|failure| panic!("{profile:?}: {failure}"));
    }
}

/// A refusal is either transient (a broker gone away: `Disconnected`) or the broker's
/// refusal of the message itself (`Rejected`, not transient), and a schedule's trace says
/// which it injected.
#[test]
fn refusals_are_transient_or_for_good() {
    struct Kinds(Arc<Mutex<Vec<bool>>>);
    async fn publish(
        Message(order): Message<u64>,
        publisher: ruststream::Publisher,
        State(kinds): State<Kinds>,
    ) -> HandlerOutcome {
        if let Err(e) = publisher.to("confirmations").send(&order).await {
            kinds.0.lock().unwrap().push(e.kind().is_transient());
        }
        HandlerOutcome::ack()
    }
    let (mut transient, mut for_good) = (0, 0);
    for seed in 0..200 {
        let kinds: Arc<Mutex<Vec<bool>>> = Arc::default();
        let seen = Arc::clone(&kinds);
        let sim = Simulation::new(
            Profile::JetStream,
            || (),
            move |broker, _| {
                App::new()
                    .state(Kinds(Arc::clone(&seen)))
                    .register(on(broker.topic("orders"), publish))
            },
        )
        .inputs("orders", orders(10));
        let trace = sim.run(seed).expect("no invariants").0.join("\n");
        let kinds = kinds.lock().unwrap().clone();
        assert_eq!(
            kinds.iter().filter(|t| **t).count(),
            trace.matches("refused (broker away)").count(),
            "{trace}"
        );
        assert_eq!(
            kinds.iter().filter(|t| !**t).count(),
            trace.matches("rejected for good").count(),
            "{trace}"
        );
        transient += kinds.iter().filter(|t| **t).count();
        for_good += kinds.iter().filter(|t| !**t).count();
    }
    assert!(transient > 0 && for_good > 0, "{transient} and {for_good}");
}
