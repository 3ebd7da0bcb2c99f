//! The same seed replays the same steps, jitter and dead-letter stamps included.

use std::sync::{Arc, Mutex};

use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Message, Meta, State, on};

use crate::support::{orders, simulation};

#[test]
fn the_same_seed_gives_the_same_steps_every_time() {
    let sim = simulation(Profile::Kafka, true, 30);
    let first = sim.run(7).expect("an idempotent handler passes");
    for _ in 0..100 {
        assert_eq!(sim.run(7).expect("passes"), first);
    }
    assert_ne!(
        sim.run(8).expect("passes"),
        first,
        "another seed, other steps"
    );
}

/// The runtime's own chance and clock come from the schedule: a backoff with jitter and
/// the dead letters' time stamps give the same calls at the same (virtual) times and
/// the same dead letters, byte for byte, on every rerun of a seed.
#[test]
fn jitter_and_dead_letter_stamps_replay_from_the_seed() {
    /// The calls, each at its time since the schedule began (the state is made then).
    #[derive(Clone)]
    struct Log(Arc<Mutex<Vec<String>>>, tokio::time::Instant);
    async fn poison(
        Message(n): Message<u64>,
        meta: Meta,
        State(log): State<Log>,
    ) -> HandlerOutcome {
        let at = log.1.elapsed();
        log.0
            .lock()
            .unwrap()
            .push(format!("{n}/{} at {at:?}", meta.attempt.number()));
        if n % 3 == 0 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    }
    let run = |seed| {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let letters: Arc<Mutex<Vec<String>>> = Arc::default();
        let (kept, seen) = (Arc::clone(&log), Arc::clone(&letters));
        Simulation::new(
            Profile::JetStream,
            move || Log(Arc::clone(&kept), tokio::time::Instant::now()),
            |broker, log| {
                let backoff = ruststream::Backoff::exponential(
                    std::time::Duration::from_millis(100),
                    std::time::Duration::from_secs(5),
                )
                .jitter(0.5);
                App::new().state(Log::clone(&log)).register(
                    on(broker.topic("orders"), poison)
                        .max_attempts(3)
                        .backoff(backoff)
                        .dead_letter("orders.dead"),
                )
            },
        )
        .inputs("orders", orders(12))
        .finally("dead letters kept", move |_, broker| {
            *seen.lock().unwrap() = broker
                .published("orders.dead")
                .iter()
                .map(|m| format!("{:?} {:?}", m.payload, m.headers))
                .collect();
            Ok(())
        })
        .run(seed)
        .expect("no invariants");
        let letters = letters.lock().unwrap().clone();
        let log = log.lock().unwrap().clone();
        (log, letters)
    };
    let first = run(11);
    assert!(!first.1.is_empty(), "dead letters: {first:?}");
    assert!(
        first.1[0].contains("x-ruststream-dead-letter-at"),
        "{}",
        first.1[0]
    );
    for _ in 0..20 {
        assert_eq!(run(11), first);
    }
}
