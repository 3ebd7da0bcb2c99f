//! Each profile injects only what its broker allows; Core NATS loses messages as its
//! spec says.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, on};

use crate::support::{EVERY, Ledger, charge, orders, simulation};

#[test]
fn core_nats_loses_messages_as_its_spec_says() {
    let sim =
        simulation(Profile::CoreNats, false, 20).finally("every order charged", |ledger, _| {
            let charged = ledger.charged.lock().unwrap();
            match (0..20).find(|order| !charged.contains_key(order)) {
                Some(order) => Err(format!("order {order} never charged")),
                None => Ok(()),
            }
        });
    let failure = sim.check(0..100).expect_err("a loss");
    assert!(
        failure.to_string().contains("lost (at most once)"),
        "{failure}"
    );
    assert!(failure.why.contains("never charged"), "{failure}");
}

/// Each profile does only what its broker may: Kafka brings back a run of records in
/// order and never reorders first deliveries; JetStream-like profiles bring back only
/// the one message whose acknowledgement was lost, as its next attempt; Core NATS never
/// delivers anything twice.
#[test]
fn each_profile_injects_only_what_its_broker_allows() {
    for profile in EVERY {
        for seed in 0..200 {
            let calls: Arc<Mutex<Vec<(u64, u32)>>> = Arc::default();
            let seen = Arc::clone(&calls);
            let sim = Simulation::new(
                profile,
                move || Ledger {
                    calls: Arc::clone(&seen),
                    ..Ledger::default()
                },
                |broker, ledger| {
                    App::new()
                        .state(Ledger::clone(&ledger))
                        .register(on(broker.topic("orders"), charge))
                },
            )
            .inputs("orders", orders(15));
            let trace = sim.run(seed).expect("no invariant");
            let cut_short = trace.0.iter().any(|step| step.contains("cut short"));
            let calls = calls.lock().unwrap().clone();
            honest(profile, seed, &calls, cut_short);
        }
    }
}

/// What a profile's schedule may show in the calls `(order, attempt)` of a handler
/// that acks everything: first deliveries in the inputs' order (a producer's duplicate
/// later, as a new message); on Core NATS nothing twice; elsewhere than Kafka a message
/// again only right after its group (at most 3 other inputs first handled between), or
/// when a crash cut handlers short, one the broker had handed out before its handler
/// ran. Attempts as the transport counts them: where the broker counts (JetStream,
/// Redis, Pulsar, memory) a redelivery is attempt 2; where the count travels in the
/// retry-count header (Kafka, RabbitMQ classic) a message read again is attempt 1, as
/// nothing was retried.
fn honest(profile: Profile, seed: u64, calls: &[(u64, u32)], cut_short: bool) {
    let mut seen = HashSet::new();
    let firsts: Vec<u64> = calls
        .iter()
        .filter(|(o, _)| seen.insert(*o))
        .map(|(o, _)| *o)
        .collect();
    assert!(
        firsts.windows(2).all(|w| w[0] < w[1]),
        "{profile:?} seed {seed}: first deliveries reordered: {calls:?}"
    );
    if profile == Profile::CoreNats {
        assert_eq!(firsts.len(), calls.len(), "Core NATS twice: {calls:?}");
    }
    let header_count = matches!(profile, Profile::Kafka | Profile::RabbitMq);
    for (at, (order, attempt)) in calls.iter().enumerate() {
        let most = if header_count { 1 } else { 2 };
        assert!(*attempt <= most, "{profile:?} seed {seed}: {calls:?}");
        let before = &calls[..at];
        let Some(first) = before.iter().position(|(o, _)| o == order) else {
            assert!(
                *attempt == 1 || cut_short,
                "{profile:?} seed {seed}: #{order} came again before it came: {calls:?}"
            );
            continue;
        };
        if profile == Profile::Kafka {
            continue;
        }
        let others: HashSet<u64> = before[first..]
            .iter()
            .filter(|(o, _)| o != order && !before[..first].iter().any(|(p, _)| p == o))
            .map(|(o, _)| *o)
            .collect();
        assert!(
            others.len() <= 3,
            "{profile:?} seed {seed}: #{order} again after more than its group: {calls:?}"
        );
    }
}
