//! What the scenarios share: a delivery log, a recording handler, waiting, publishing,
//! and the `RELIABILITY|…` lines.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream_core::{Delivery, Headers, Outgoing};

use crate::{App, HandlerOutcome, on};

use super::Bed;

/// Publishes each payload to `address` at once (`send_all`), asserting each went out.
pub(super) async fn publish_all(
    bed: &impl Bed,
    address: &str,
    payloads: impl IntoIterator<Item = Vec<u8>, IntoIter: Send>,
) {
    let messages = payloads
        .into_iter()
        .map(|payload| Outgoing::new(address, payload));
    for (i, sent) in bed
        .publisher()
        .send_all(messages)
        .await
        .into_iter()
        .enumerate()
    {
        if let Err(e) = sent {
            panic!("publishing message {i} to `{address}`: {e}");
        }
    }
}

/// What handlers saw, shared with the test.
#[derive(Default, Clone)]
pub(super) struct Log(Arc<Mutex<Vec<(Delivery, Instant)>>>);
impl Log {
    pub(super) fn push(&self, d: &Delivery) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((d.clone(), Instant::now()));
    }
    pub(super) fn all(&self) -> Vec<(Delivery, Instant)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}
pub(super) async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
pub(super) fn recorder(
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
pub(super) async fn publish(
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
pub(super) fn count(log: &Log, payload: &[u8]) -> usize {
    log.all()
        .iter()
        .filter(|(d, _)| &d.payload()[..] == payload)
        .count()
}
/// An app whose one registration on `address` records every delivery in `log` and acks
/// it, started and warmed up.
pub(super) async fn acking_app(bed: &impl Bed, address: &str, log: &Log) -> crate::Running {
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
pub(super) fn dead_letter_reader<B: Bed>(
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
pub(super) async fn read_past_a_marker(bed: &impl Bed, address: &str, log: &Log) {
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
pub(super) fn reliability(bed: &impl Bed, tried: &str, lost: &str, duplicated: &str, dead: &str) {
    println!(
        "RELIABILITY|{}|bad input: {tried}|{lost}|{duplicated}|{dead}",
        bed.label()
    );
}
/// Asserts the start was refused (E4) with each `(registration, rule)` among the
/// violations, on `address`.
pub(super) fn assert_refused(
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
pub(super) fn guard_rail(bed: &impl Bed, tried: &str, lost: &str, duplicated: &str, dead: &str) {
    println!(
        "RELIABILITY|{}|guard rail: {tried}|{lost}|{duplicated}|{dead}",
        bed.label()
    );
}
/// An app whose `work` registration always retries under `max_attempts(3)` and a dead
/// letter, and whose `dead` registration reads the dead letters; returns the app, the
/// address to publish to, and the logs of both.
pub(super) async fn always_retry_to_dead_letter(
    bed: &impl Bed,
) -> (crate::Running, String, Log, Log) {
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
