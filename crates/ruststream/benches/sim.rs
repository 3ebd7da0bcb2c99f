//! Seeded fault schedules per second (`testing::sim`): 1,000 schedules of 100 messages
//! under the JetStream profile, a handler that decodes its order and dedupes by message
//! id. `cargo bench -p ruststream --features sim --bench sim` (`SIM_SCHEDULES`,
//! `SIM_MESSAGES` change the run).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ruststream::core::MESSAGE_ID_HEADER;
use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Headers, Message, State, on};

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashSet<String>>>);

async fn handle(
    Message(order): Message<u64>,
    headers: Headers,
    State(seen): State<Seen>,
) -> HandlerOutcome {
    std::hint::black_box(order.wrapping_mul(31));
    let id = headers
        .get_str(MESSAGE_ID_HEADER)
        .unwrap_or_default()
        .to_owned();
    seen.0.lock().unwrap().insert(id);
    HandlerOutcome::ack()
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let (schedules, messages) = (
        setting("SIM_SCHEDULES", 1_000),
        setting("SIM_MESSAGES", 100),
    );
    let sim = Simulation::new(Profile::JetStream, Seen::default, |broker, seen| {
        App::new()
            .state(Seen::clone(&seen))
            .register(on(broker.topic("orders"), handle))
    })
    .inputs(
        "orders",
        (0..messages).map(|n| serde_json::to_vec(&n).expect("json")),
    )
    .invariant("nothing", |_, _| Ok(()));
    let started = Instant::now();
    let ran = sim.check(0..schedules).expect("every schedule passes");
    let took = started.elapsed();
    println!(
        "sim/jetstream: {ran} schedules of {messages} messages in {took:.2?}: {:.0} schedules/s, {:.0} messages/s (load {})",
        ran as f64 / took.as_secs_f64(),
        (ran * messages) as f64 / took.as_secs_f64(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split(' ')
            .next()
            .unwrap_or("?"),
    );
}
