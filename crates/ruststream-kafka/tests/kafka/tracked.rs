//! K3, K4: `Commit::Tracked` with parallel lanes: the committed position waits for
//! unfinished and retried records, and lanes by key keep per-key order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{
    Script, committed, committed_becomes, create_topic, eventually, kafka, produce, topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_kafka::Commit;
use tokio::sync::Semaphore;

use crate::support::start;

/// Gates holding chosen offsets' handlers until a test releases them.
#[derive(Default)]
struct Gates(Mutex<HashMap<i64, Arc<Semaphore>>>);

impl Gates {
    fn hold(&self, offset: i64) {
        self.0
            .lock()
            .unwrap()
            .insert(offset, Arc::new(Semaphore::new(0)));
    }
    fn release(&self, offset: i64) {
        if let Some(gate) = self.0.lock().unwrap().get(&offset) {
            gate.add_permits(1);
        }
    }
    fn gate(&self, offset: i64) -> Option<Arc<Semaphore>> {
        self.0.lock().unwrap().get(&offset).cloned()
    }
}

fn gated(
    script: Arc<Script>,
    gates: Arc<Gates>,
) -> impl Fn(
    ruststream::Delivery,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = HandlerOutcome> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |d: ruststream::Delivery| {
        let (script, gates) = (Arc::clone(&script), Arc::clone(&gates));
        Box::pin(async move {
            script.record(&d);
            if let Some(gate) = d.metadata().offset.and_then(|o| gates.gate(o)) {
                let _permit = gate.acquire().await;
            }
            HandlerOutcome::ack()
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_the_seeds_worked_example_on_a_real_partition_with_parallel_lanes() {
    let kafka = kafka().await;
    let (t, group) = (unique("k3"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let gates = Arc::new(Gates::default());
    gates.hold(12);
    gates.hold(15);
    // Keyless records go round robin over the lanes, so 10..15 all run at once.
    let app = start(
        App::new().register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                gated(Arc::clone(&script), Arc::clone(&gates)),
            )
            .lanes(16),
        ),
    )
    .await;
    for i in 0..16 {
        produce(
            &kafka,
            &t,
            None,
            format!("r{i}").as_bytes(),
            &Headers::new(),
        )
        .await;
    }
    eventually(Duration::from_secs(30), "all 16 delivered", || {
        script.count() == 16
    })
    .await;
    // 10, 11, 13, 14 settled; 12 and 15 running → stored position 11, committed 12.
    committed_becomes(&group, &t, 0, 12, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        committed(&group, &t, 0).await,
        Some(12),
        "never passes 12 while it runs"
    );
    gates.release(12);
    // 12 settles → stored position 14, committed 15 (15 still running).
    committed_becomes(&group, &t, 0, 15, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(committed(&group, &t, 0).await, Some(15));
    gates.release(15);
    committed_becomes(&group, &t, 0, 16, Duration::from_secs(10)).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k4_tracked_retry_is_handled_again_before_the_next_record_and_the_position_waits() {
    let kafka = kafka().await;
    let (t, group) = (unique("k4"), unique("g"));
    create_topic(&t, 1).await;
    let gates = Arc::new(Gates::default());
    let script = Script::new(|_| HandlerOutcome::ack());
    let retried = Arc::new(Mutex::new(false));
    let handler = {
        let (script, gates, retried) = (
            Arc::clone(&script),
            Arc::clone(&gates),
            Arc::clone(&retried),
        );
        move |d: ruststream::Delivery| {
            let (script, gates, retried) = (
                Arc::clone(&script),
                Arc::clone(&gates),
                Arc::clone(&retried),
            );
            async move {
                script.record(&d);
                if d.metadata().offset == Some(0) {
                    if !std::mem::replace(&mut *retried.lock().unwrap(), true) {
                        return HandlerOutcome::retry();
                    }
                    // The second attempt waits, so the position has to wait with it.
                    if let Some(gate) = gates.gate(0) {
                        let _permit = gate.acquire().await;
                    }
                }
                HandlerOutcome::ack()
            }
        }
    };
    gates.hold(0);
    let app = start(
        App::new().register(on(topic(&kafka, &t, &group, Commit::Tracked), handler).lanes(4)),
    )
    .await;
    // Offsets 0 and 3 share a key (one lane, in order); 1 and 2 run beside them.
    for (key, payload) in [("a", "r0"), ("b", "r1"), ("b", "r2"), ("a", "r3")] {
        produce(&kafka, &t, Some(key), payload.as_bytes(), &Headers::new()).await;
    }
    eventually(Duration::from_secs(30), "0 twice, 1 and 2 once", || {
        script.count() == 4
    })
    .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let key_a: Vec<i64> = script
        .calls()
        .iter()
        .filter(|c| c.key.as_deref() == Some(&b"a"[..]))
        .map(|c| c.offset.unwrap())
        .collect();
    assert_eq!(key_a, vec![0, 0], "3 waits behind the retried 0");
    assert_eq!(
        committed(&group, &t, 0).await,
        None,
        "1 and 2 settled, but 0 still runs"
    );
    gates.release(0);
    eventually(Duration::from_secs(10), "3 handled", || script.count() == 5).await;
    let key_a: Vec<i64> = script
        .calls()
        .iter()
        .filter(|c| c.key.as_deref() == Some(&b"a"[..]))
        .map(|c| c.offset.unwrap())
        .collect();
    assert_eq!(key_a, vec![0, 0, 3]);
    committed_becomes(&group, &t, 0, 4, Duration::from_secs(10)).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_by_key_keep_per_key_order_and_the_position_reaches_the_end() {
    let kafka = kafka().await;
    let (t, group) = (unique("lanes"), unique("g"));
    create_topic(&t, 2).await;
    let order: Arc<Mutex<HashMap<String, Vec<u32>>>> = Arc::default();
    let handler = {
        let order = Arc::clone(&order);
        move |d: ruststream::Delivery| {
            let order = Arc::clone(&order);
            async move {
                let key = String::from_utf8(d.key().unwrap().to_vec()).unwrap();
                let n: u32 = std::str::from_utf8(d.payload()).unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_millis(u64::from(n % 3))).await;
                order.lock().unwrap().entry(key).or_default().push(n);
                HandlerOutcome::ack()
            }
        }
    };
    let app = start(
        App::new().register(on(topic(&kafka, &t, &group, Commit::Tracked), handler).lanes(4)),
    )
    .await;
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for n in 0..120u32 {
        let key = format!("key-{}", n % 6);
        let (p, o) = produce(
            &kafka,
            &t,
            Some(&key),
            n.to_string().as_bytes(),
            &Headers::new(),
        )
        .await;
        ends.insert(p, o + 1);
    }
    eventually(Duration::from_secs(60), "all handled", || {
        order.lock().unwrap().values().map(Vec::len).sum::<usize>() == 120
    })
    .await;
    for (key, seen) in order.lock().unwrap().iter() {
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{key}: {seen:?}");
    }
    for (p, end) in ends {
        committed_becomes(&group, &t, p, end, Duration::from_secs(10)).await;
    }
    app.stop().await;
}

/// K3 while a delivery waits for its lane (the consumer is then not polled): the
/// positions settled before the wait reach the group's commit during it, not when the
/// lane frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_what_settled_is_committed_while_a_delivery_waits_for_its_lane() {
    let kafka = kafka().await;
    let (t, group) = (unique("k3-wait"), unique("g"));
    create_topic(&t, 1).await;
    // 0 and 1 (key b) finish at once; 2 (key a) holds its lane, 3 queues behind it and
    // 4 waits for that lane: the driver fetches nothing until 2 is released.
    for (i, key) in ["b", "b", "a", "a", "a"].iter().enumerate() {
        produce(
            &kafka,
            &t,
            Some(key),
            format!("r{i}").as_bytes(),
            &Headers::new(),
        )
        .await;
    }
    let script = Script::new(|_| HandlerOutcome::ack());
    let gates = Arc::new(Gates::default());
    gates.hold(2);
    let app = start(
        App::new().register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                gated(Arc::clone(&script), Arc::clone(&gates)),
            )
            .lanes(2),
        ),
    )
    .await;
    eventually(Duration::from_secs(30), "0, 1 and 2 ran", || {
        script.count() == 3
    })
    .await;
    committed_becomes(&group, &t, 0, 2, Duration::from_secs(5)).await;
    assert_eq!(script.count(), 3, "2 still holds its lane");
    gates.release(2);
    committed_becomes(&group, &t, 0, 5, Duration::from_secs(10)).await;
    app.stop().await;
}
