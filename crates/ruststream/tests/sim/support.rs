//! What the modules of this test binary share: the profiles, the charging service and its
//! ledger, and the simulation that checks each order is charged at most once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use ruststream::core::MESSAGE_ID_HEADER;
use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Headers, Message, Meta, State, on};

/// The profiles of brokers that deliver at least once.
pub(crate) const AT_LEAST_ONCE: [Profile; 5] = [
    Profile::Kafka,
    Profile::JetStream,
    Profile::RabbitMq,
    Profile::Redis,
    Profile::Pulsar,
];

/// Every transport's profile.
pub(crate) const EVERY: [Profile; 6] = [
    Profile::Kafka,
    Profile::JetStream,
    Profile::RabbitMq,
    Profile::Redis,
    Profile::Pulsar,
    Profile::CoreNats,
];

/// What the service saw: each handler call's order and attempt, and the charges.
#[derive(Clone, Default)]
pub(crate) struct Ledger {
    pub(crate) calls: Arc<Mutex<Vec<(u64, u32)>>>,
    pub(crate) charged: Arc<Mutex<HashMap<u64, u32>>>,
    pub(crate) seen: Arc<Mutex<HashSet<String>>>,
}

pub(crate) async fn charge(
    Message(order): Message<u64>,
    meta: Meta,
    State(ledger): State<Ledger>,
) -> HandlerOutcome {
    ledger
        .calls
        .lock()
        .unwrap()
        .push((order, meta.attempt.number()));
    *ledger.charged.lock().unwrap().entry(order).or_default() += 1;
    HandlerOutcome::ack()
}

pub(crate) async fn charge_once(
    Message(order): Message<u64>,
    headers: Headers,
    State(ledger): State<Ledger>,
) -> HandlerOutcome {
    let id = headers
        .get_str(MESSAGE_ID_HEADER)
        .unwrap_or_default()
        .to_owned();
    if ledger.seen.lock().unwrap().insert(id) {
        *ledger.charged.lock().unwrap().entry(order).or_default() += 1;
    }
    HandlerOutcome::ack()
}

pub(crate) fn orders(n: u64) -> impl Iterator<Item = Vec<u8>> {
    (0..n).map(|n| serde_json::to_vec(&n).expect("json"))
}

pub(crate) fn at_most_once(
    ledger: &Ledger,
    _: &ruststream::memory::MemoryBroker,
) -> Result<(), String> {
    match ledger.charged.lock().unwrap().iter().find(|(_, n)| **n > 1) {
        Some((order, n)) => Err(format!("order {order} charged {n} times")),
        None => Ok(()),
    }
}

pub(crate) fn simulation(profile: Profile, idempotent: bool, n: u64) -> Simulation<Ledger> {
    Simulation::new(profile, Ledger::default, move |broker, ledger| {
        let app = App::new().state(Ledger::clone(&ledger));
        if idempotent {
            app.register(on(broker.topic("orders"), charge_once))
        } else {
            app.register(on(broker.topic("orders"), charge))
        }
    })
    .inputs("orders", orders(n))
    .invariant("charged at most once", at_most_once)
}
