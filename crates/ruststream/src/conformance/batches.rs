//! Batch registrations ([`on_batch`]): each message of a batch settles exactly as it
//! would alone; a failed call is a failed attempt of every message in it; a message that
//! does not decode goes its own way; batches are cut by size and by time; a key's
//! messages keep their order across batches.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;

use crate::batch::Batch;
use crate::{App, BatchOutcome, HandlerOutcome, on_batch};

use super::Bed;
use super::support::*;

/// The test payload: a number, and for the order scenario a sequence within its key.
#[derive(Debug, Clone, Copy, Deserialize)]
struct Numbered {
    n: u32,
    #[serde(default)]
    seq: u32,
}

/// What one call of a batch handler saw: per message its number, sequence, attempt and
/// key.
type Call = Vec<(u32, u32, u32, Option<String>)>;

/// Every call of a batch handler, shared with the test.
#[derive(Default, Clone)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record(&self, batch: &Batch<Numbered>) {
        let call = batch
            .iter()
            .map(|item| {
                let key = item.key().map(|k| String::from_utf8_lossy(k).into_owned());
                (item.value.n, item.value.seq, item.attempt().number(), key)
            })
            .collect();
        self.lock().push(call);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Call>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The attempts each number was seen with, in order.
    fn attempts(&self) -> BTreeMap<u32, Vec<u32>> {
        let mut seen: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for call in self.lock().iter() {
            for (n, _, attempt, _) in call {
                seen.entry(*n).or_default().push(*attempt);
            }
        }
        seen
    }

    fn messages(&self) -> usize {
        self.lock().iter().map(Vec::len).sum()
    }

    fn sizes(&self) -> Vec<usize> {
        self.lock().iter().map(Vec::len).collect()
    }
}

fn numbered(n: u32) -> Vec<u8> {
    format!(r#"{{"n":{n}}}"#).into_bytes()
}

/// Mixed outcomes within one batch, each settled as alone: 0 ack, 1 drop, 2 `retry()`
/// once, 3 `retry_after` once, 4 always `retry()` (so at the cap of 2 attempts it goes to
/// the dead letter), and an undecodable message (to the dead letter alone, the handler
/// never sees it).
pub async fn batch_outcomes_settle_each_message_as_alone(bed: impl Bed) {
    let (address, dead) = (bed.address().await, bed.address().await);
    let (calls, letters) = (Calls::default(), Log::default());
    let handler = {
        let calls = calls.clone();
        move |batch: Batch<Numbered>| {
            calls.record(&batch);
            let outcomes = batch
                .iter()
                .map(|item| match (item.value.n, item.attempt().number()) {
                    (0 | 999, _) | (2 | 3, 2..) => HandlerOutcome::ack(),
                    (1, _) => HandlerOutcome::drop(),
                    (2, _) | (4, _) => HandlerOutcome::retry(),
                    _ => HandlerOutcome::retry_after(Duration::from_millis(300)),
                });
            let outcome = BatchOutcome::each(outcomes.collect::<Vec<_>>());
            async move { outcome }
        }
    };
    let app = App::new()
        .register(
            on_batch(bed.subscribe(&address, "suite"), handler)
                .name("batch")
                .max_attempts(2)
                .dead_letter(&dead)
                .max_wait(Duration::from_millis(200)),
        )
        .register(dead_letter_reader(&bed, &dead, &letters))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    let payloads = (0..5).map(numbered).chain([b"not json".to_vec()]);
    publish_all(&bed, &address, payloads).await;
    until(
        Duration::from_secs(60),
        "every outcome settled and two dead letters",
        || {
            let seen = calls.attempts();
            seen.get(&2).map(Vec::len) == Some(2)
                && seen.get(&3).map(Vec::len) == Some(2)
                && seen.get(&4).map(Vec::len) == Some(2)
                && letters.len() == 2
        },
    )
    .await;
    read_past_a_batch_marker(&bed, &address, &calls).await;
    let seen = calls.attempts();
    assert_eq!(seen[&0], [1], "ack is final");
    assert_eq!(seen[&1], [1], "drop is final");
    assert_eq!(seen[&2], [1, 2], "retry() comes back as the next attempt");
    assert_eq!(seen[&3], [1, 2], "retry_after comes back once");
    assert_eq!(seen[&4], [1, 2], "exactly max_attempts runs");
    let mut dead_payloads: Vec<Vec<u8>> = letters
        .all()
        .iter()
        .map(|(d, _)| d.payload().to_vec())
        .collect();
    dead_payloads.sort();
    let mut expected = vec![numbered(4), b"not json".to_vec()];
    expected.sort();
    assert_eq!(
        dead_payloads, expected,
        "one dead letter each, as published"
    );
    assert!(
        calls.lock().iter().all(|call| !call.is_empty()),
        "an empty batch reached the handler"
    );
    app.stop().await;
}

/// A call that returns `Err`, panics, or passes its deadline is a failed attempt of every
/// message of its batch: each comes back as its next attempt (errors at attempt 1, a
/// panic at 2, the deadline at 3, an ack at 4), and none goes to the dead letter.
pub async fn batch_failures_retry_every_message(bed: impl Bed) {
    let (address, dead) = (bed.address().await, bed.address().await);
    let (calls, letters) = (Calls::default(), Log::default());
    let handler = {
        let calls = calls.clone();
        move |batch: Batch<Numbered>| {
            calls.record(&batch);
            let attempt = batch.iter().map(|i| i.attempt().number()).min();
            async move {
                match attempt {
                    Some(1) => Err("the bulk write failed"),
                    Some(2) => panic!("the bulk write panicked"),
                    Some(3) => {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        Ok(BatchOutcome::ack_all())
                    }
                    _ => Ok(BatchOutcome::ack_all()),
                }
            }
        }
    };
    let app = App::new()
        .register(
            on_batch(bed.subscribe(&address, "suite"), handler)
                .name("failing")
                .max_attempts(5)
                .dead_letter(&dead)
                .timeout(Duration::from_millis(500))
                .max_wait(Duration::from_millis(200)),
        )
        .register(dead_letter_reader(&bed, &dead, &letters))
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    publish_all(&bed, &address, (0..3).map(numbered)).await;
    until(Duration::from_secs(60), "each message at attempt 4", || {
        (0..3).all(|n| calls.attempts().get(&n).is_some_and(|a| a.contains(&4)))
    })
    .await;
    tokio::time::sleep(bed.redelivered_within()).await;
    for (n, attempts) in calls.attempts() {
        assert_eq!(
            attempts,
            [1, 2, 3, 4],
            "message {n}: each failure one attempt"
        );
    }
    assert_eq!(letters.len(), 0, "nothing reached the dead letter");
    app.stop().await;
}

/// A batch is cut at `max_batch` messages, and `max_wait` after its first message when
/// fewer come: 25 messages at `max_batch(10)` come in calls of at most 10, all of them
/// once; then 3 messages with a long `max_batch` come in within a few seconds.
pub async fn batch_is_cut_by_size_and_by_time(bed: impl Bed) {
    let address = bed.address().await;
    let (app, calls) = acking_batch_app(&bed, &address, 1, 10, Duration::from_millis(300)).await;
    publish_all(&bed, &address, (0..25).map(numbered)).await;
    until(Duration::from_secs(60), "25 messages handled", || {
        calls.messages() == 25
    })
    .await;
    assert!(
        calls.sizes().iter().all(|&size| (1..=10).contains(&size)),
        "batches of 1 to 10: {:?}",
        calls.sizes()
    );
    let seen = calls.attempts();
    assert!((0..25).all(|n| seen.get(&n).map(Vec::len) == Some(1)));
    app.stop().await;

    let address = bed.address().await;
    let (app, calls) = acking_batch_app(&bed, &address, 1, 1000, Duration::from_millis(300)).await;
    for n in 0..3 {
        publish(&bed, &address, None, &[], &numbered(n)).await;
    }
    until(
        Duration::from_secs(10),
        "3 messages handed over although the batch is not full",
        || calls.messages() == 3,
    )
    .await;
    app.stop().await;
}

/// Per-key order within and across batches, over several lanes: 5 keys of 20 messages
/// each, interleaved, at `max_batch(7)` and `lanes(3)`: every key's messages reach the
/// handler in their order, each once.
pub async fn batch_keeps_per_key_order(bed: impl Bed) {
    let address = bed.address().await;
    let (app, calls) = acking_batch_app(&bed, &address, 3, 7, Duration::from_millis(50)).await;
    for seq in 0..20 {
        for key in 0..5 {
            let payload = format!(r#"{{"n":{},"seq":{seq}}}"#, key * 100 + seq);
            publish(
                &bed,
                &address,
                Some(&format!("k{key}")),
                &[],
                payload.as_bytes(),
            )
            .await;
        }
    }
    until(Duration::from_secs(60), "100 messages handled", || {
        calls.messages() == 100
    })
    .await;
    let mut by_key: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for call in calls.lock().iter() {
        for (_, seq, _, key) in call {
            by_key
                .entry(key.clone().expect("keyed"))
                .or_default()
                .push(*seq);
        }
    }
    for (key, seqs) in by_key {
        assert_eq!(seqs, (0..20).collect::<Vec<_>>(), "key {key} out of order");
    }
    app.stop().await;
}

/// An app whose one batch registration on `address` (`lanes`, `max_batch`, `max_wait`)
/// records every call and acks all, started and warmed up.
async fn acking_batch_app(
    bed: &impl Bed,
    address: &str,
    lanes: usize,
    max_batch: usize,
    max_wait: Duration,
) -> (crate::Running, Calls) {
    let calls = Calls::default();
    let handler = {
        let calls = calls.clone();
        move |batch: Batch<Numbered>| {
            calls.record(&batch);
            async { BatchOutcome::ack_all() }
        }
    };
    let app = App::new()
        .register(
            on_batch(bed.subscribe(address, "suite"), handler)
                .lanes(lanes)
                .max_batch(max_batch)
                .max_wait(max_wait),
        )
        .start()
        .await
        .expect("start");
    tokio::time::sleep(bed.warm_up()).await;
    (app, calls)
}

/// Publishes a marker and waits until a batch handler saw it, then as long as an
/// unsettled delivery takes to come back.
async fn read_past_a_batch_marker(bed: &impl Bed, address: &str, calls: &Calls) {
    publish(bed, address, None, &[], &numbered(999)).await;
    until(Duration::from_secs(60), "the marker", || {
        calls.attempts().contains_key(&999)
    })
    .await;
    tokio::time::sleep(bed.redelivered_within()).await;
}
