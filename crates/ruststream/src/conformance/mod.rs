//! One behaviour suite for every transport (feature `conformance`).
//!
//! A transport's tests implement [`Bed`] for each way it can be used (a subscription type,
//! a commit mode) and invoke [`conformance_tests!`](crate::conformance_tests), which
//! writes one test per scenario below. The scenarios check what the spec promises on
//! every broker, the same way: a round trip keeps payload, headers and key; an ack is
//! never delivered again; a retry under a declaration comes back as the next attempt;
//! `retry_after` comes back no earlier than its delay; at the cap the handler has run
//! exactly `max_attempts` times and exactly one dead letter with the original payload
//! and headers exists; `lanes(n)` keeps per-key order; a stop lets the running handler
//! finish and settles it; `drop()` is final; two members of a group share the work;
//! broken registrations are refused all at once; the retry path follows the capabilities
//! the transport declares on its descriptor (the broker's own count, or the runtime's
//! header-counted copies). Bad input (an undecodable payload,
//! forged retry counts, empty and large payloads, hostile header values) never crashes
//! the service, loses nothing, and prints a `RELIABILITY|…` line for RELIABILITY.md.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream_core::{Delivery, Descriptor, Headers, Outgoing};

use crate::{App, HandlerOutcome, Publisher, on};

/// A transport as the suite uses it.
pub trait Bed: Send + Sync + 'static {
    /// Its subscription descriptor.
    type Descriptor: Descriptor;

    /// A new address nobody else uses, ready to be published to and read from.
    fn address(&self) -> impl Future<Output = String> + Send;

    /// A subscription on `address` as group (or subscription) `group`.
    fn subscribe(&self, address: &str, group: &str) -> Self::Descriptor;

    /// A confirmed publisher.
    fn publisher(&self) -> Publisher;

    /// How long a started app may need before it receives what is published (a Kafka
    /// group forming, a Core subscription reaching the server).
    fn warm_up(&self) -> Duration;

    /// Whether the broker carries a message key.
    fn keys(&self) -> bool;

    /// How long an unsettled delivery may take to come back to a new app of the same group
    /// (JetStream: its `ack_wait`). Scenarios that check something is *not* delivered
    /// again wait this long after the new app has read a later message. Default 1 s.
    fn redelivered_within(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Whether two apps of one group on one address can both receive messages (false
    /// where the address has one partition, or the subscription one active consumer).
    fn shares_one_address(&self) -> bool {
        true
    }

    /// The transport's name in the `RELIABILITY|…` lines the bad-input scenarios print
    /// (collected into RELIABILITY.md by `scripts/reliability`).
    fn label(&self) -> String;
}

/// What handlers saw, shared with the test.
#[derive(Default, Clone)]
struct Log(Arc<Mutex<Vec<(Delivery, Instant)>>>);

impl Log {
    fn push(&self, d: &Delivery) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((d.clone(), Instant::now()));
    }
    fn all(&self) -> Vec<(Delivery, Instant)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn recorder(
    log: Log,
    decide: impl Fn(&Delivery) -> HandlerOutcome + Clone + Send + Sync + 'static,
) -> impl Fn(Delivery) -> std::pin::Pin<Box<dyn Future<Output = HandlerOutcome> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |d: Delivery| {
        let (log, decide) = (log.clone(), decide.clone());
        Box::pin(async move {
            log.push(&d);
            decide(&d)
        })
    }
}

async fn publish(
    bed: &impl Bed,
    address: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    payload: &[u8],
) {
    let mut message = Outgoing::new(address, Bytes::copy_from_slice(payload));
    message.key = key.map(|k| Bytes::copy_from_slice(k.as_bytes()));
    message.headers = headers
        .iter()
        .map(|(n, v)| (*n, Bytes::copy_from_slice(v.as_bytes())))
        .collect::<Headers>();
    if let Err(e) = bed.publisher().publish(message).await {
        panic!("publishing to `{address}`: {e}");
    }
}

/// How many deliveries in `log` carry `payload`.
fn count(log: &Log, payload: &[u8]) -> usize {
    log.all()
        .iter()
        .filter(|(d, _)| &d.payload()[..] == payload)
        .count()
}

/// An app whose one registration on `address` records every delivery in `log` and acks
/// it, started and warmed up.
async fn acking_app(bed: &impl Bed, address: &str, log: &Log) -> crate::Running {
    let app = App::new()
        .register(on(
            bed.subscribe(address, "suite"),
            recorder(log.clone(), |_| HandlerOutcome::ack()),
        ))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    app
}

/// The registration named `dead` that reads the dead letters on `dead` into `letters`.
fn dead_letter_reader<B: Bed>(
    bed: &B,
    dead: &str,
    letters: &Log,
) -> crate::Registration<B::Descriptor, impl crate::middleware::Service> {
    on(
        bed.subscribe(dead, "suite-dead"),
        recorder(letters.clone(), |_| HandlerOutcome::ack()),
    )
    .name("dead")
}

/// After a restart (the new app warmed up): publishes a marker and waits until the new
/// app handled it (so it is reading, past anything published before), then as long as an
/// unsettled delivery takes to come back.
async fn read_past_a_marker(bed: &impl Bed, address: &str, log: &Log) {
    publish(bed, address, None, &[], b"marker").await;
    until(
        Duration::from_secs(60),
        "the marker published after the restart",
        || count(log, b"marker") > 0,
    )
    .await;
    tokio::time::sleep(bed.redelivered_within()).await;
}

/// Prints a `RELIABILITY|…` line for `scripts/reliability`.
fn reliability(bed: &impl Bed, tried: &str, lost: &str, duplicated: &str, dead: &str) {
    println!(
        "RELIABILITY|{}|bad input: {tried}|{lost}|{duplicated}|{dead}",
        bed.label()
    );
}

/// Asserts the start was refused (E4) with each `(registration, rule)` among the
/// violations, on `address`.
fn assert_refused(
    refused: Result<crate::Running, crate::StartError>,
    address: &str,
    expected: &[(&str, &str)],
) {
    let violations = match refused {
        Err(crate::StartError::Invalid(violations)) => violations,
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("an app with broken registrations started"),
    };
    for (registration, rule) in expected {
        assert!(
            violations.iter().any(|v| v.registration == *registration
                && v.address == address
                && v.rule.contains(rule)),
            "no violation of `{rule}` by `{registration}` on `{address}` in {violations:?}"
        );
    }
}

/// Prints a guard-rail `RELIABILITY|…` line.
fn guard_rail(bed: &impl Bed, tried: &str, lost: &str, duplicated: &str, dead: &str) {
    println!(
        "RELIABILITY|{}|guard rail: {tried}|{lost}|{duplicated}|{dead}",
        bed.label()
    );
}

/// Payload, headers and (where the broker has keys) the key arrive as published.
pub async fn round_trip(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let app = acking_app(&bed, &address, &log).await;
    publish(
        &bed,
        &address,
        Some("key-1"),
        &[("trace", "t-1"), ("tenant", "eu")],
        b"\x00payload\xff",
    )
    .await;
    until(Duration::from_secs(30), "delivered", || log.len() == 1).await;
    let (d, _) = &log.all()[0];
    assert_eq!(&d.payload()[..], b"\x00payload\xff");
    assert_eq!(d.headers().get_str("trace"), Some("t-1"));
    assert_eq!(d.headers().get_str("tenant"), Some("eu"));
    if bed.keys() {
        assert_eq!(d.key().map(|k| &k[..]), Some(&b"key-1"[..]));
    }
    assert_eq!(d.attempt().number(), 1);
    app.stop().await;
}

/// An acked delivery is not delivered again, to this app or the next one.
pub async fn ack_is_final(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let app = acking_app(&bed, &address, &log).await;
    publish(&bed, &address, None, &[], b"once").await;
    until(Duration::from_secs(30), "delivered", || log.len() == 1).await;
    app.stop().await;
    let app = acking_app(&bed, &address, &log).await;
    read_past_a_marker(&bed, &address, &log).await;
    assert_eq!(count(&log, b"once"), 1, "an ack is final");
    app.stop().await;
}

/// Under a declaration, `retry()` brings the delivery back as the next attempt.
pub async fn retry_is_the_next_attempt(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let log = Log::default();
    let decide = |d: &Delivery| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    };
    let app = App::new()
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(log.clone(), decide),
            )
            .max_attempts(3)
            .dead_letter(dead),
        )
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"again").await;
    until(Duration::from_secs(30), "delivered twice", || {
        log.len() == 2
    })
    .await;
    let attempts: Vec<u32> = log
        .all()
        .iter()
        .map(|(d, _)| d.attempt().number())
        .collect();
    assert_eq!(attempts, vec![1, 2]);
    app.stop().await;
}

/// `retry_after(d)` comes back no earlier than d.
pub async fn retry_after_waits(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let delay = Duration::from_millis(700);
    let decide = move |d: &Delivery| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(delay)
        } else {
            HandlerOutcome::ack()
        }
    };
    let app = App::new()
        .register(on(
            bed.subscribe(&address, "suite"),
            recorder(log.clone(), decide),
        ))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"later").await;
    until(Duration::from_secs(30), "delivered again", || {
        log.len() == 2
    })
    .await;
    let all = log.all();
    assert!(
        all[1].1 - all[0].1 >= delay,
        "back after {:?}",
        all[1].1 - all[0].1
    );
    app.stop().await;
}

/// An app whose `work` registration always retries under `max_attempts(3)` and a dead
/// letter, and whose `dead` registration reads the dead letters; returns the app, the
/// address to publish to, and the logs of both.
async fn always_retry_to_dead_letter(bed: &impl Bed) -> (crate::Running, String, Log, Log) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let (runs, letters) = (Log::default(), Log::default());
    let app = App::new()
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(runs.clone(), |_| HandlerOutcome::retry()),
            )
            .name("work")
            .max_attempts(3)
            .dead_letter(&dead),
        )
        .register(dead_letter_reader(bed, &dead, &letters))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    (app, address, runs, letters)
}

/// At the cap: exactly `max_attempts` runs and exactly one dead letter, with the
/// original payload and headers.
pub async fn cap_and_dead_letter(bed: impl Bed) {
    let (app, address, runs, letters) = always_retry_to_dead_letter(&bed).await;
    publish(&bed, &address, None, &[("trace", "t-9")], b"\x01poison\xfe").await;
    let waited = tokio::time::timeout(Duration::from_secs(60), async {
        while letters.len() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "no dead letter within 60 s; the handler ran {} times",
        runs.len()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(runs.len(), 3, "exactly max_attempts runs");
    assert_eq!(letters.len(), 1, "exactly one dead letter");
    let (letter, _) = &letters.all()[0];
    assert_eq!(&letter.payload()[..], b"\x01poison\xfe");
    assert_eq!(letter.headers().get_str("trace"), Some("t-9"));
    app.stop().await;
}

/// The retry path follows the capabilities the transport declares on its descriptor:
/// where the broker counts attempts (`native_count`), a retry is a redelivery and carries
/// no retry-count header; where it does not, the runtime publishes copies whose
/// `x-ruststream-retry-count` counts the copies before them (absent, `1`, `2`). Either
/// way the handler sees attempts 1, 2, 3, then one dead letter follows.
pub async fn retry_path_follows_the_capabilities(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let work = bed.subscribe(&address, "suite");
    let native = work.capabilities().native_count;
    let (runs, letters) = (Log::default(), Log::default());
    let app = App::new()
        .register(
            on(work, recorder(runs.clone(), |_| HandlerOutcome::retry()))
                .name("work")
                .max_attempts(3)
                .dead_letter(&dead),
        )
        .register(dead_letter_reader(&bed, &dead, &letters))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"counted").await;
    until(Duration::from_secs(60), "the dead letter", || {
        letters.len() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut seen: Vec<(u32, Option<String>)> = runs
        .all()
        .iter()
        .map(|(d, _)| {
            (
                d.attempt().number(),
                d.headers()
                    .get_str(crate::RETRY_COUNT_HEADER)
                    .map(str::to_owned),
            )
        })
        .collect();
    seen.sort();
    let attempts: Vec<u32> = seen.iter().map(|(a, _)| *a).collect();
    assert_eq!(attempts, vec![1, 2, 3]);
    let counts: Vec<Option<&str>> = seen.iter().map(|(_, c)| c.as_deref()).collect();
    if native {
        assert_eq!(
            counts,
            vec![None, None, None],
            "the broker counts: no copies"
        );
    } else {
        assert_eq!(
            counts,
            vec![None, Some("1"), Some("2")],
            "the runtime counts in its copies"
        );
    }
    assert_eq!(letters.len(), 1, "exactly one dead letter");
    app.stop().await;
}

/// `lanes(4)` keeps each key's order while keys run side by side.
pub async fn lanes_keep_per_key_order(bed: impl Bed) {
    let address = bed.address().await;
    let seen: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
    let handler = {
        let seen = Arc::clone(&seen);
        move |d: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                let n: u32 = std::str::from_utf8(d.payload())
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(u64::from(n % 3))).await;
                let key = d
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default();
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(key)
                    .or_default()
                    .push(n);
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler).lanes(4))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    for n in 0..60u32 {
        publish(
            &bed,
            &address,
            Some(&format!("key-{}", n % 4)),
            &[],
            n.to_string().as_bytes(),
        )
        .await;
    }
    until(Duration::from_secs(60), "all handled", || {
        seen.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .map(Vec::len)
            .sum::<usize>()
            == 60
    })
    .await;
    for (key, order) in seen.lock().unwrap_or_else(PoisonError::into_inner).iter() {
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{key}: {order:?}");
    }
    app.stop().await;
}

/// A stop lets the running handler finish, and settles it: the next app does not see it.
pub async fn e3_stop_drains_and_settles(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let finished = Arc::new(Mutex::new(false));
    let handler = {
        let (log, finished) = (log.clone(), Arc::clone(&finished));
        move |d: Delivery| {
            let (log, finished) = (log.clone(), Arc::clone(&finished));
            async move {
                log.push(&d);
                tokio::time::sleep(Duration::from_millis(500)).await;
                *finished.lock().unwrap_or_else(PoisonError::into_inner) = true;
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler.clone()))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"slow").await;
    until(Duration::from_secs(30), "started", || log.len() == 1).await;
    app.stop().await;
    assert!(
        *finished.lock().unwrap_or_else(PoisonError::into_inner),
        "the running handler finished"
    );
    let app = App::new()
        .register(on(bed.subscribe(&address, "suite"), handler))
        .start()
        .await
        .expect("restart");
    tokio::time::sleep(bed.warm_up()).await;
    read_past_a_marker(&bed, &address, &log).await;
    assert_eq!(
        count(&log, b"slow"),
        1,
        "it was settled before the stop ended"
    );
    app.stop().await;
}

/// E1: a payload the handler's codec cannot decode never reaches the handler and goes to
/// the dead letter unchanged.
pub async fn e1_undecodable_is_dead_lettered(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let (decoded, letters) = (Log::default(), Log::default());
    let typed = {
        let decoded = decoded.clone();
        move |crate::Message(_value): crate::Message<serde_json::Value>, d: Delivery| {
            let decoded = decoded.clone();
            async move {
                decoded.push(&d);
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), typed)
                .name("typed")
                .max_attempts(3)
                .dead_letter(&dead),
        )
        .register(dead_letter_reader(&bed, &dead, &letters))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(
        &bed,
        &address,
        None,
        &[("trace", "bad")],
        b"{\"not\": json\xff",
    )
    .await;
    publish(&bed, &address, None, &[], b"{\"fine\": true}").await;
    until(
        Duration::from_secs(60),
        "the dead letter and the good message",
        || letters.len() == 1 && decoded.len() == 1,
    )
    .await;
    let (letter, _) = &letters.all()[0];
    assert_eq!(&letter.payload()[..], b"{\"not\": json\xff");
    assert_eq!(letter.headers().get_str("trace"), Some("bad"));
    assert_eq!(
        &decoded.all()[0].0.payload()[..],
        b"{\"fine\": true}",
        "the handler saw only the good one"
    );
    reliability(
        &bed,
        "an undecodable JSON payload next to a good one",
        "lost 0 of 2",
        &format!("{} handled twice", decoded.len() - 1),
        "1 dead-lettered (the undecodable one, byte-identical)",
    );
    app.stop().await;
}

/// Forged `x-ruststream-retry-count` values (negative, not a number, huge) never crash
/// the service: each message is handled and, always retried under a cap of 3, ends in
/// exactly one dead letter after at most 3 runs.
pub async fn forged_retry_counts_end_in_one_dead_letter(bed: impl Bed) {
    let (app, address, runs, letters) = always_retry_to_dead_letter(&bed).await;
    let forged = ["-1", "banana", "99999999999999999999"];
    for value in forged {
        publish(
            &bed,
            &address,
            None,
            &[(crate::RETRY_COUNT_HEADER, value)],
            value.as_bytes(),
        )
        .await;
    }
    until(Duration::from_secs(60), "a dead letter for each", || {
        letters.len() == forged.len()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(letters.len(), forged.len(), "exactly one dead letter each");
    for value in forged {
        let runs = runs
            .all()
            .iter()
            .filter(|(d, _)| &d.payload()[..] == value.as_bytes())
            .count();
        assert!((1..=3).contains(&runs), "`{value}` ran {runs} times");
    }
    reliability(
        &bed,
        "3 forged retry-count headers (-1, banana, 2^66), always retried under max_attempts(3)",
        "lost 0 of 3",
        "retried to the cap by design",
        "3 dead-lettered (one each)",
    );
    app.stop().await;
}

/// An empty payload and a 256 KiB payload arrive intact.
pub async fn empty_and_large_payloads_arrive_intact(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let app = acking_app(&bed, &address, &log).await;
    let large: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    publish(&bed, &address, None, &[], b"").await;
    publish(&bed, &address, None, &[], &large).await;
    until(Duration::from_secs(30), "both delivered", || log.len() == 2).await;
    let mut sizes: Vec<usize> = log.all().iter().map(|(d, _)| d.payload().len()).collect();
    sizes.sort_unstable();
    assert_eq!(sizes, vec![0, large.len()]);
    assert!(
        log.all().iter().any(|(d, _)| d.payload()[..] == large[..]),
        "the large payload is byte-identical"
    );
    reliability(
        &bed,
        "an empty and a 256 KiB payload",
        "lost 0 of 2",
        &format!("{} handled twice", log.len() - 2),
        "0 dead-lettered",
    );
    app.stop().await;
}

/// E2: a panicking handler is a failed attempt: under a declaration the delivery comes
/// back as the next attempt, and the service goes on.
pub async fn e2_a_panic_is_a_failed_attempt(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let log = Log::default();
    let panics_first = {
        let log = log.clone();
        move |d: Delivery| {
            let log = log.clone();
            async move {
                log.push(&d);
                assert!(d.attempt().number() > 1, "boom on the first attempt");
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), panics_first)
                .max_attempts(3)
                .dead_letter(dead),
        )
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"panics once").await;
    until(
        Duration::from_secs(30),
        "handled again after the panic",
        || log.len() == 2,
    )
    .await;
    let attempts: Vec<u32> = log
        .all()
        .iter()
        .map(|(d, _)| d.attempt().number())
        .collect();
    assert_eq!(attempts, vec![1, 2]);
    app.stop().await;
}

/// `drop()` is final: the delivery is not delivered again, to this app or the next one,
/// and makes no dead letter, even under a declaration.
pub async fn drop_is_final(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let (runs, letters) = (Log::default(), Log::default());
    let app = |runs: Log, letters: Log| {
        App::new()
            .register(
                on(
                    bed.subscribe(&address, "suite"),
                    recorder(runs, |_| HandlerOutcome::drop()),
                )
                .name("work")
                .max_attempts(3)
                .dead_letter(&dead),
            )
            .register(dead_letter_reader(&bed, &dead, &letters))
            .start()
    };
    let first = app(runs.clone(), letters.clone()).await.expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"unwanted").await;
    until(Duration::from_secs(30), "delivered", || runs.len() == 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.stop().await;
    let second = app(runs.clone(), letters.clone()).await.expect("restart");
    tokio::time::sleep(bed.warm_up()).await;
    read_past_a_marker(&bed, &address, &runs).await;
    assert_eq!(count(&runs, b"unwanted"), 1, "a drop is final");
    assert_eq!(letters.len(), 0, "a drop makes no dead letter");
    second.stop().await;
}

/// Two apps in one group share the work: every message is handled, and only once; where
/// the address can be shared ([`Bed::shares_one_address`]), both members take some.
pub async fn competing_consumers_share_the_work(bed: impl Bed) {
    let address = bed.address().await;
    let (one, two) = (Log::default(), Log::default());
    // Each message takes a little work, so a busy member leaves the next one to the other.
    let member = |log: Log| {
        let work = move |d: Delivery| {
            let log = log.clone();
            async move {
                log.push(&d);
                tokio::time::sleep(Duration::from_millis(10)).await;
                HandlerOutcome::ack()
            }
        };
        App::new()
            .register(on(bed.subscribe(&address, "suite"), work))
            .start()
    };
    let first = member(one.clone()).await.expect("start the first member");
    tokio::time::sleep(bed.warm_up()).await;
    let second = member(two.clone()).await.expect("start the second member");
    // The second member joining may move work (a Kafka rebalance): let it settle.
    tokio::time::sleep(bed.warm_up() * 2).await;
    let n = 40;
    for i in 0..n {
        let key = format!("key-{i}");
        publish(&bed, &address, Some(&key), &[], key.as_bytes()).await;
    }
    until(Duration::from_secs(60), "all handled", || {
        one.len() + two.len() >= n
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut payloads: Vec<Vec<u8>> = one
        .all()
        .iter()
        .chain(two.all().iter())
        .map(|(d, _)| d.payload().to_vec())
        .collect();
    payloads.sort();
    let total = payloads.len();
    payloads.dedup();
    assert_eq!(payloads.len(), n, "every message handled");
    assert_eq!(total, n, "no message handled by both members");
    if bed.shares_one_address() {
        assert!(
            one.len() > 0 && two.len() > 0,
            "both members took work: {} and {}",
            one.len(),
            two.len()
        );
    }
    first.stop().await;
    second.stop().await;
}

/// E4: a start with several broken registrations fails, listing each with its address
/// and the rule it breaks.
pub async fn e4_broken_registrations_are_all_refused(bed: impl Bed) {
    let address = bed.address().await;
    let log = Log::default();
    let refused = App::new()
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(log.clone(), |_| HandlerOutcome::ack()),
            )
            .name("no-attempts")
            .max_attempts(0),
        )
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(log.clone(), |_| HandlerOutcome::ack()),
            )
            .name("dead-letters-to-itself")
            .dead_letter(&address),
        )
        .start()
        .await;
    assert_refused(
        refused,
        &address,
        &[
            ("no-attempts", "max_attempts must be at least 1"),
            (
                "dead-letters-to-itself",
                "is read by this registration itself",
            ),
        ],
    );
    assert_eq!(log.len(), 0, "no handler ran");
}

/// SPEC G4: a dead letter without `max_attempts` (never reached), a dead letter the
/// registration reads itself (handled again without end), a lane count above the bound
/// and a zero handler deadline are all refused at start, each named.
pub async fn g4_unbounded_registrations_are_refused(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let log = Log::default();
    let handler = || recorder(log.clone(), |_| HandlerOutcome::ack());
    let refused = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("uncapped")
                .dead_letter(&dead),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("reads-its-dead-letter")
                .max_attempts(2)
                .dead_letter(&address),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("too-many-lanes")
                .lanes(crate::MAX_LANES + 1),
        )
        .register(
            on(bed.subscribe(&address, "suite"), handler())
                .name("no-time")
                .timeout(Duration::ZERO),
        )
        .start()
        .await;
    assert_refused(
        refused,
        &address,
        &[
            ("uncapped", "without max_attempts"),
            (
                "reads-its-dead-letter",
                "is read by this registration itself",
            ),
            ("too-many-lanes", "above the bound"),
            ("no-time", "timeout must be longer than zero"),
        ],
    );
    assert_eq!(log.len(), 0, "no handler ran");
    guard_rail(
        &bed,
        "a dead letter without max_attempts, a dead letter the registration reads itself, lanes above the bound, a zero deadline",
        "refused at start, each named",
        "no handler ran",
        "none",
    );
}

/// SPEC G1: a handler that never returns is cancelled at its deadline, and the attempt
/// counts as failed: the delivery comes back as the next attempt.
pub async fn g1_a_hung_handler_is_cancelled_at_its_deadline(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let log = Log::default();
    let deadline = Duration::from_millis(500);
    let hang_first = {
        let log = log.clone();
        move |d: Delivery| {
            let log = log.clone();
            async move {
                log.push(&d);
                if d.attempt().number() == 1 {
                    std::future::pending::<()>().await;
                }
                HandlerOutcome::ack()
            }
        }
    };
    let app = App::new()
        .register(
            on(bed.subscribe(&address, "suite"), hang_first)
                .timeout(deadline)
                .max_attempts(3)
                .dead_letter(dead),
        )
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"hangs once").await;
    until(Duration::from_secs(30), "back after the deadline", || {
        log.len() == 2
    })
    .await;
    let runs = log.all();
    assert_eq!(runs[1].0.attempt().number(), 2, "the cancelled run counted");
    assert!(
        runs[1].1 - runs[0].1 >= deadline - Duration::from_millis(20),
        "cancelled no earlier than its deadline"
    );
    app.stop().await;
    guard_rail(
        &bed,
        "hung handler: the first attempt never returns, timeout(500 ms), max_attempts(3)",
        "lost 0 of 1 (cancelled at the deadline, back as attempt 2)",
        "0 handled twice",
        "0 dead-lettered",
    );
}

/// Header values a careless or hostile producer may send (not UTF-8, a line break that
/// would inject another header, 16 KiB long, a non-ASCII name): each is either refused
/// by the publisher with the header named, or arrives byte-identical, and its dead
/// letter too. Nothing crashes; nothing is altered silently.
pub async fn hostile_headers_arrive_intact_or_are_refused_by_name(bed: impl Bed) {
    let (app, address, runs, letters) = always_retry_to_dead_letter(&bed).await;
    let long = "x".repeat(16 * 1024);
    let hostile: [(&str, &str, &[u8]); 4] = [
        ("not-utf8", "x-hostile-binary", b"\xff\xfe\x00\x01"),
        ("line-break", "x-hostile-crlf", b"a\r\nInjected: 1"),
        ("long", "x-hostile-16k", long.as_bytes()),
        ("non-ascii-name", "x-hostile-n\u{e4}me", b"value"),
    ];
    let mut accepted = Vec::new();
    let mut refused = Vec::new();
    for (label, name, value) in hostile {
        let mut message = Outgoing::new(&address, Bytes::from_static(label.as_bytes()));
        message.headers = [(name, Bytes::copy_from_slice(value))]
            .into_iter()
            .collect::<Headers>();
        match bed.publisher().publish(message).await {
            Ok(()) => accepted.push((label, name, value)),
            Err(e) => {
                let text = e.to_string();
                assert!(
                    text.contains(name),
                    "refusing `{label}` must name the header `{name}`: {text}"
                );
                refused.push(label);
            }
        }
    }
    until(
        Duration::from_secs(60),
        "a dead letter for each accepted one",
        || letters.len() == accepted.len(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        letters.len(),
        accepted.len(),
        "exactly one dead letter each"
    );
    for (label, _, _) in &accepted {
        assert_eq!(
            count(&letters, label.as_bytes()),
            1,
            "`{label}`: one dead letter"
        );
    }
    for (label, name, value) in &accepted {
        let arrived = |log: &Log| {
            log.all()
                .into_iter()
                .filter(|(d, _)| &d.payload()[..] == label.as_bytes())
                .map(|(d, _)| d.headers().get(name).map(|v| v.to_vec()))
                .collect::<Vec<_>>()
        };
        let runs = arrived(&runs);
        assert!(!runs.is_empty(), "`{label}` was never handled");
        for seen in runs.iter().chain(arrived(&letters).iter()) {
            assert_eq!(seen.as_deref(), Some(*value), "`{label}` arrived altered");
        }
    }
    reliability(
        &bed,
        "4 hostile header values (not UTF-8, CRLF injection, 16 KiB, non-ASCII name)",
        &format!(
            "lost 0 of {} accepted; refused by name at publish: {}",
            accepted.len(),
            if refused.is_empty() {
                "none".to_owned()
            } else {
                refused.join(", ")
            }
        ),
        "retried to the cap by design",
        &format!("{} dead-lettered (headers byte-identical)", accepted.len()),
    );
    app.stop().await;
}

/// Writes one `#[tokio::test]` per scenario for the bed `$bed` (an expression, awaited
/// inside each test). `keys` also writes the per-key order scenario.
#[macro_export]
macro_rules! conformance_tests {
    ($bed:expr) => {
        $crate::conformance_tests!(@each $bed; round_trip, ack_is_final, retry_is_the_next_attempt, retry_after_waits, cap_and_dead_letter, e3_stop_drains_and_settles, e1_undecodable_is_dead_lettered, forged_retry_counts_end_in_one_dead_letter, empty_and_large_payloads_arrive_intact, e2_a_panic_is_a_failed_attempt, drop_is_final, retry_path_follows_the_capabilities, competing_consumers_share_the_work, e4_broken_registrations_are_all_refused, hostile_headers_arrive_intact_or_are_refused_by_name, g4_unbounded_registrations_are_refused, g1_a_hung_handler_is_cancelled_at_its_deadline);
    };
    ($bed:expr, keys) => {
        $crate::conformance_tests!($bed);
        $crate::conformance_tests!(@each $bed; lanes_keep_per_key_order);
    };
    (@each $bed:expr; $($scenario:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                $crate::conformance::$scenario($bed.await).await;
            }
        )*
    };
}
