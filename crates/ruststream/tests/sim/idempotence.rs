//! A handler that is not idempotent, or is cut short between two writes by a crash, is
//! caught under every at-least-once profile; one that dedupes passes.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use ruststream::testing::sim::{Profile, Simulation};
use ruststream::{App, HandlerOutcome, Message, State, on};

use crate::support::{AT_LEAST_ONCE, simulation};

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
