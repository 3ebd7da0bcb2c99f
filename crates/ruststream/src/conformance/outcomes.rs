//! Each outcome becomes what the spec names: round trip, ack, retry, retry_after, the cap
//! and its dead letter, the retry path, drop.

use std::time::Duration;

use ruststream_core::{Delivery, Descriptor};

use crate::{App, HandlerOutcome, on};

use super::Bed;
use super::support::*;

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

/// G2: a registration's backoff turns every `retry()` into a delayed redelivery through
/// the transport's own delay path (a native delay, a held wait, a copy after the delay):
/// a handler that always retries under `max_attempts(3)` sees its attempts at least the
/// backoff apart (400 ms, then 800 ms), then the dead letter.
pub async fn g2_backoff_spaces_every_retry(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let (log, letters) = (Log::default(), Log::default());
    let first = Duration::from_millis(400);
    let app = App::new()
        .register(
            on(
                bed.subscribe(&address, "suite"),
                recorder(log.clone(), |_: &Delivery| HandlerOutcome::retry()),
            )
            .name("spaced")
            .max_attempts(3)
            .dead_letter(&dead)
            .backoff(crate::Backoff::exponential(first, Duration::from_secs(5))),
        )
        .register(dead_letter_reader(&bed, &dead, &letters))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"spaced").await;
    until(
        Duration::from_secs(60),
        "three attempts and the dead letter",
        || log.len() == 3 && letters.len() == 1,
    )
    .await;
    let at: Vec<_> = log.all().into_iter().map(|(_, at)| at).collect();
    let gaps = [at[1] - at[0], at[2] - at[1]];
    assert!(
        gaps[0] >= first && gaps[1] >= first * 2,
        "attempts {gaps:?} apart, not the backoff's 400 ms then 800 ms"
    );
    app.stop().await;
}

/// At the cap: exactly `max_attempts` runs and exactly one dead letter, with the
/// original payload and headers, and (where the runtime publishes it) the headers that
/// say why and where it came from (D6).
pub async fn d6_at_the_cap_one_dead_letter_says_why(bed: impl Bed) {
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
    let capabilities = bed.subscribe(&address, "suite").capabilities();
    // Pulsar's dead letters are its client's (DeadLetters::Broker): they say nothing.
    if capabilities.dead_letters != ruststream_core::DeadLetters::Broker {
        says_why(letter, &address);
        if bed.label().starts_with("Kafka") {
            // Where the last attempt was read: its partition and offset.
            for name in [
                ruststream_core::DEAD_LETTER_PARTITION,
                ruststream_core::DEAD_LETTER_OFFSET,
            ] {
                let value = letter.headers().get_str(name);
                assert!(
                    value.is_some_and(|v| v.parse::<i64>().is_ok()),
                    "{name}: {value:?}"
                );
            }
        }
    }
    app.stop().await;
}

/// A dead letter the runtime published says why and where it came from (SPEC D6).
fn says_why(letter: &Delivery, source: &str) {
    use ruststream_core::{
        DEAD_LETTER_AT, DEAD_LETTER_ATTEMPTS, DEAD_LETTER_REASON, DEAD_LETTER_REGISTRATION,
        DEAD_LETTER_SOURCE,
    };
    let header = |name| letter.headers().get_str(name);
    assert_eq!(header(DEAD_LETTER_REASON), Some("retry()"));
    assert_eq!(header(DEAD_LETTER_REGISTRATION), Some("work"));
    assert_eq!(header(DEAD_LETTER_SOURCE), Some(source));
    assert_eq!(header(DEAD_LETTER_ATTEMPTS), Some("3"));
    let at = header(DEAD_LETTER_AT).expect("when");
    assert!(
        at.len() == 24 && at.starts_with("20") && at.ends_with('Z'),
        "{at} is not an RFC 3339 UTC time"
    );
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
