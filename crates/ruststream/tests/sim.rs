//! Seeded fault schedules (`testing::sim`): the same seed replays the same steps; each
//! profile injects only what its broker may do; a handler that is not idempotent is
//! caught under every at-least-once profile and passes once it dedupes by message id;
//! Core NATS loses messages as its spec says.
#![cfg(feature = "sim")]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ruststream::core::MESSAGE_ID_HEADER;
use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Headers, Message, Meta, State, on};

/// The profiles of brokers that deliver at least once.
const AT_LEAST_ONCE: [Profile; 5] = [
    Profile::Kafka,
    Profile::JetStream,
    Profile::RabbitMq,
    Profile::Redis,
    Profile::Pulsar,
];

/// Every transport's profile.
const EVERY: [Profile; 6] = [
    Profile::Kafka,
    Profile::JetStream,
    Profile::RabbitMq,
    Profile::Redis,
    Profile::Pulsar,
    Profile::CoreNats,
];

/// What the service saw: each handler call's order and attempt, and the charges.
#[derive(Clone, Default)]
struct Ledger {
    calls: Arc<Mutex<Vec<(u64, u32)>>>,
    charged: Arc<Mutex<HashMap<u64, u32>>>,
    seen: Arc<Mutex<HashSet<String>>>,
}

async fn charge(
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

async fn charge_once(
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

fn orders(n: u64) -> impl Iterator<Item = Vec<u8>> {
    (0..n).map(|n| serde_json::to_vec(&n).expect("json"))
}

fn at_most_once(ledger: &Ledger, _: &ruststream::memory::MemoryBroker) -> Result<(), String> {
    match ledger.charged.lock().unwrap().iter().find(|(_, n)| **n > 1) {
        Some((order, n)) => Err(format!("order {order} charged {n} times")),
        None => Ok(()),
    }
}

fn simulation(profile: Profile, idempotent: bool, n: u64) -> Simulation<Ledger> {
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

#[test]
fn a_handler_that_is_not_idempotent_is_caught_under_every_at_least_once_profile() {
    for profile in AT_LEAST_ONCE {
        let failure = simulation(profile, false, 20)
            .check(0..1_000)
            .expect_err("a redelivery charges twice");
        let shown = failure.to_string();
        assert!(shown.contains(&format!("seed {}", failure.seed)), "{shown}");
        assert!(shown.contains("charged 2 times"), "{profile:?}: {shown}");
        assert!(
            shown.contains("delivered again") || shown.contains("published again"),
            "{profile:?}: a redelivery or a duplicate: {shown}"
        );
    }
}

#[test]
fn the_same_handler_deduplicating_by_message_id_passes_10_000_seeds() {
    for profile in AT_LEAST_ONCE {
        let started = Instant::now();
        let ran = simulation(profile, true, 20)
            .check(0..10_000)
            .expect("passes");
        assert_eq!(ran, 10_000);
        eprintln!(
            "{profile:?}: 10,000 schedules of 20 messages in {:?}",
            started.elapsed()
        );
    }
}

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

/// A transfer's two writes, a database round trip apart.
#[derive(Clone, Default)]
struct Book(Arc<Mutex<Vec<String>>>);

/// Skips a transfer already credited (a redelivery of a finished one), but writes its
/// two entries apart: a crash between them leaves a debit the redelivery writes again.
async fn transfer(Message(n): Message<u64>, State(book): State<Book>) -> HandlerOutcome {
    if book.0.lock().unwrap().contains(&format!("credit {n}")) {
        return HandlerOutcome::ack();
    }
    book.0.lock().unwrap().push(format!("debit {n}"));
    tokio::time::sleep(std::time::Duration::from_millis(1 + n % 5)).await;
    book.0.lock().unwrap().push(format!("credit {n}"));
    HandlerOutcome::ack()
}

/// Both writes at once (as in one database transaction).
async fn transfer_whole(Message(n): Message<u64>, State(book): State<Book>) -> HandlerOutcome {
    tokio::time::sleep(std::time::Duration::from_millis(1 + n % 5)).await;
    let mut book = book.0.lock().unwrap();
    if !book.contains(&format!("debit {n}")) {
        book.extend([format!("debit {n}"), format!("credit {n}")]);
    }
    HandlerOutcome::ack()
}

fn transfers(
    profile: Profile,
    whole: bool,
    book: impl Fn() -> Book + Send + Sync + 'static,
) -> Simulation<Book> {
    Simulation::new(profile, book, move |broker, book| {
        let app = App::new().state(Book::clone(&book));
        if whole {
            app.register(
                on(broker.topic("orders"), transfer_whole)
                    .lanes(4)
                    .max_in_flight(8),
            )
        } else {
            app.register(
                on(broker.topic("orders"), transfer)
                    .lanes(4)
                    .max_in_flight(8),
            )
        }
    })
    .keyed_inputs(
        "orders",
        (0..20_u64).map(|n| (format!("k{}", n % 4), serde_json::to_vec(&n).expect("json"))),
    )
    .invariant("every debit credited once", |book: &Book, _| {
        let book = book.0.lock().unwrap();
        let count = |entry: &str| book.iter().filter(|e| *e == entry).count();
        let open = book
            .iter()
            .filter(|e| e.starts_with("debit"))
            .find(|debit| count(debit) > 1 || count(&debit.replace("debit", "credit")) > 1);
        match open {
            Some(debit) => Err(format!("{debit} written {} times", count(debit))),
            None => Ok(()),
        }
    })
    .finally("every transfer whole", |book: &Book, _| {
        let book = book.0.lock().unwrap();
        match book
            .iter()
            .filter(|e| e.starts_with("debit"))
            .find(|debit| !book.contains(&debit.replace("debit", "credit")))
        {
            Some(debit) => Err(format!("{debit} never credited")),
            None => Ok(()),
        }
    })
}

/// Several deliveries in flight at once (lanes, handlers awaiting): the interleaving is
/// the seed's, the same on every rerun; a crash cuts a handler between its two writes
/// and the redelivery writes the first again, caught under every at-least-once
/// profile; the handler writing both at once passes.
#[test]
fn handlers_cut_short_by_a_crash_are_caught_and_interleavings_replay() {
    let book = |seed| {
        let writes: Arc<Mutex<Vec<String>>> = Arc::default();
        let kept = Arc::clone(&writes);
        let ran = transfers(Profile::JetStream, false, move || Book(Arc::clone(&kept))).run(seed);
        (format!("{ran:?}"), writes.lock().unwrap().clone())
    };
    let first = book(3);
    assert!(
        first
            .1
            .windows(2)
            .any(|w| w[0].starts_with("debit") && w[1].starts_with("debit")),
        "handlers overlapped: {:?}",
        first.1
    );
    for _ in 0..100 {
        assert_eq!(book(3), first, "the same interleaving");
    }
    for profile in AT_LEAST_ONCE {
        let failure = transfers(profile, false, Book::default)
            .check(0..1_000)
            .expect_err("a transfer cut short");
        assert!(
            failure.to_string().contains("cut short"),
            "{profile:?}: {failure}"
        );
        transfers(profile, true, Book::default)
            .check(0..1_000)
            .unwrap_or_else(|f| panic!("{profile:?}: {f}"));
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
