//! Bad input never crashes the service nor loses a message: undecodable payloads, forged
//! retry counts, empty and large payloads, panics, hostile headers.

use std::time::Duration;

use bytes::Bytes;
use ruststream_core::{Delivery, Headers, Outgoing};

use crate::{App, HandlerOutcome, on};

use super::Bed;
use super::support::*;

/// A typed handler: decodes JSON, records each delivery it got, acks.
fn decodes_json_into(
    log: &Log,
) -> impl Fn(crate::Message<serde_json::Value>, Delivery) -> std::future::Ready<HandlerOutcome>
+ Clone
+ Send
+ Sync
+ 'static {
    let log = log.clone();
    move |crate::Message(_value), d: Delivery| {
        log.push(&d);
        std::future::ready(HandlerOutcome::ack())
    }
}

/// E1: a payload the handler's codec cannot decode never reaches the handler and goes to
/// the dead letter unchanged.
pub async fn e1_undecodable_is_dead_lettered(bed: impl Bed) {
    let address = bed.address().await;
    let dead = bed.address().await;
    let (decoded, letters) = (Log::default(), Log::default());
    let typed = decodes_json_into(&decoded);
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

/// E1, the default without a dead letter: an undecodable payload never reaches the
/// handler, is settled as dropped, and does not come back: counted `undecodable` once
/// however long one waits, while a good message behind it is handled.
pub async fn e1_undecodable_without_a_dead_letter_is_dropped_once(bed: impl Bed) {
    let address = bed.address().await;
    let decoded = Log::default();
    let typed = decodes_json_into(&decoded);
    let app = App::new()
        .metrics()
        .register(on(bed.subscribe(&address, "suite"), typed).name("typed"))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish(&bed, &address, None, &[], b"not json").await;
    publish(&bed, &address, None, &[], b"{\"fine\": true}").await;
    until(Duration::from_secs(60), "the good message", || {
        decoded.len() == 1
    })
    .await;
    tokio::time::sleep(bed.redelivered_within() + Duration::from_secs(1)).await;
    let metrics = app.metrics().await.expect("metrics on");
    let undecodable = counted(&metrics, "ruststream_outcomes_total", "undecodable");
    assert_eq!(
        undecodable, 1.0,
        "dropped once, not delivered again:\n{metrics}"
    );
    assert_eq!(decoded.len(), 1, "the handler saw only the good one");
    reliability(
        &bed,
        "an undecodable JSON payload, no dead letter declared (the default: dropped)",
        "dropped by design: 1 of 2, with an ERROR naming the address",
        "0",
        "none declared",
    );
    app.stop().await;
}

/// The sum of `series`'s samples of kind `kind` in a metrics text.
fn counted(metrics: &str, series: &str, kind: &str) -> f64 {
    let kind = format!("kind=\"{kind}\"");
    metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{series}{{")) && line.contains(&kind))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
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
        let mut message = Outgoing::new(address.as_str(), Bytes::from_static(label.as_bytes()));
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
