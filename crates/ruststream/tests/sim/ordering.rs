//! Order under faults: two inputs of one key never swap, and lanes keep per-key order
//! on every profile.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Message, Meta, State, on};

use crate::support::EVERY;

/// Inputs of different keys may swap places, two of one key never do.
#[test]
fn keys_keep_their_order_and_only_different_keys_swap() {
    #[derive(Clone, Default)]
    struct Order(Arc<Mutex<Vec<u64>>>);
    async fn record(Message(n): Message<u64>, State(seen): State<Order>) -> HandlerOutcome {
        seen.0.lock().unwrap().push(n);
        HandlerOutcome::ack()
    }
    let inputs = (0..30_u64).map(|n| (format!("k{}", n % 3), serde_json::to_vec(&n).unwrap()));
    let sim = |profile| {
        Simulation::new(profile, Order::default, |broker, seen| {
            App::new()
                .state(Order::clone(&seen))
                .register(on(broker.topic("orders"), record))
        })
        .keyed_inputs("orders", inputs.clone())
    };
    for profile in [Profile::Kafka, Profile::JetStream, Profile::CoreNats] {
        sim(profile)
            .invariant("per key in order", |seen: &Order, _| {
                let seen = seen.0.lock().unwrap();
                for key in 0..3 {
                    let of_key: Vec<u64> = seen.iter().copied().filter(|n| n % 3 == key).collect();
                    // First deliveries of a key in order (a redelivery or duplicate repeats one).
                    let firsts: Vec<u64> = of_key.iter().copied().fold(Vec::new(), |mut v, n| {
                        if !v.contains(&n) {
                            v.push(n);
                        }
                        v
                    });
                    if firsts.windows(2).any(|w| w[0] > w[1]) {
                        return Err(format!("key k{key} out of order: {of_key:?}"));
                    }
                }
                Ok(())
            })
            .check(0..500)
            .expect("a key keeps its order");
    }
    let failure = sim(Profile::JetStream)
        .invariant("all in order", |seen: &Order, _| {
            let seen = seen.0.lock().unwrap();
            match seen.windows(2).find(|w| w[1] < w[0] && w[0] != w[1]) {
                Some(w) => Err(format!("{} after {}", w[1], w[0])),
                None => Ok(()),
            }
        })
        .check(0..500)
        .expect_err("different keys swap");
    assert!(
        failure.to_string().contains("(different keys)"),
        "{failure}"
    );
}

/// The conformance suite's `lanes_keep_per_key_order`, under faults: four lanes,
/// handlers awaiting, inputs in bursts, crashes while they run, redeliveries and
/// duplicates; per key, each message's first handling still follows the publishing
/// order, on every profile, for 300 seeds each (the real-broker scenario runs one
/// schedule, without faults).
#[test]
fn lanes_keep_per_key_order_under_every_profile() {
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<HashMap<String, Vec<u64>>>>);
    async fn handle(
        Message(n): Message<u64>,
        meta: Meta,
        State(seen): State<Seen>,
    ) -> HandlerOutcome {
        tokio::time::sleep(std::time::Duration::from_millis(n % 3)).await;
        let key = String::from_utf8_lossy(meta.key.as_deref().unwrap_or_default()).into_owned();
        seen.0.lock().unwrap().entry(key).or_default().push(n);
        HandlerOutcome::ack()
    }
    for profile in EVERY {
        Simulation::new(profile, Seen::default, |broker, seen| {
            App::new()
                .state(Seen::clone(&seen))
                .register(on(broker.topic("orders"), handle).lanes(4))
        })
        .keyed_inputs(
            "orders",
            (0..40_u64).map(|n| {
                (
                    format!("key-{}", n % 4),
                    serde_json::to_vec(&n).expect("json"),
                )
            }),
        )
        .invariant("per key, first handlings in order", |seen: &Seen, _| {
            for (key, order) in seen.0.lock().unwrap().iter() {
                let mut once = HashSet::new();
                let first: Vec<u64> = order.iter().copied().filter(|n| once.insert(*n)).collect();
                if first.windows(2).any(|w| w[0] > w[1]) {
                    return Err(format!("{key}: {order:?}"));
                }
            }
            Ok(())
        })
        .check(0..300)
        .unwrap_or_else(|f| panic!("{profile:?}: {f}"));
    }
}
