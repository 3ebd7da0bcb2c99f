//! Kafka against a real Kafka-API broker (tansu): SPEC K2-K5, K7-K9, observed on the
//! broker's side (committed offsets read back, records on the retry and dead-letter
//! topics with their partition, key and headers).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{
    Script, committed, committed_becomes, create_topic, eventually, handler, kafka, logs, produce,
    read_topic, topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, RETRY_COUNT_HEADER, Running, on};
use ruststream_kafka::{Commit, Offset};
use tokio::sync::Semaphore;

/// A subscription with quick commits, and a short session so the broker forms the group
/// quickly (tansu waits about half the session timeout for members to join).
async fn start(app: App) -> Running {
    app.start().await.expect("the app starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_auto_retry_is_unsupported_logged_and_never_comes_back() {
    let kafka = kafka().await;
    let (t, group) = (unique("k2"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Auto),
        handler(Arc::clone(&script)),
    )))
    .await;
    produce(&kafka, &t, None, b"x", &Headers::new()).await;
    produce(&kafka, &t, None, b"y", &Headers::new()).await;
    eventually(Duration::from_secs(30), "both handled", || {
        script.count() == 2
    })
    .await;
    committed_becomes(&group, &t, 0, 2, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(script.count(), 2, "nothing brings a record back under Auto");
    assert!(
        logs().contains("the broker has no operation for `retry`"),
        "Unsupported logged"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_auto_ack_and_drop_commit_through_the_timer() {
    let kafka = kafka().await;
    let (t, group) = (unique("k2ack"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|d| {
        if d.payload() == "drop" {
            HandlerOutcome::drop()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Auto),
        handler(Arc::clone(&script)),
    )))
    .await;
    for p in [&b"ack"[..], b"drop", b"ack"] {
        produce(&kafka, &t, None, p, &Headers::new()).await;
    }
    committed_becomes(&group, &t, 0, 3, Duration::from_secs(30)).await;
    assert_eq!(script.count(), 3);
    app.stop().await;
}

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

async fn retry_after_once(commit: Commit) {
    let kafka = kafka().await;
    let (t, group) = (unique("k7"), unique("g"));
    create_topic(&t, 3).await;
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(300))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, commit),
        handler(Arc::clone(&script)),
    )))
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t-7");
    let (partition, offset) =
        produce(&kafka, &t, Some("customer-9"), b"{\"id\":9}", &headers).await;
    eventually(Duration::from_secs(30), "the copy is handled", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert!(calls[1].at - calls[0].at >= Duration::from_millis(300));
    assert_eq!(calls[1].attempt, 2);
    let records = read_topic(&t, 3, 2, Duration::from_secs(10)).await;
    assert_eq!(records.len(), 2, "the original and one copy");
    let copy = records
        .iter()
        .find(|r| r.offset != offset || r.partition != partition)
        .unwrap();
    assert_eq!(copy.partition, partition, "K9: the key's partition");
    assert!(copy.offset > offset);
    assert_eq!(copy.key.as_deref(), Some(&b"customer-9"[..]));
    assert_eq!(&copy.payload[..], b"{\"id\":9}");
    assert_eq!(copy.header("trace"), Some("t-7"));
    assert_eq!(copy.header(RETRY_COUNT_HEADER), Some("1"));
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_retry_after_copies_to_the_topic_with_key_headers_and_count_under_tracked() {
    retry_after_once(Commit::Tracked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_retry_after_copies_to_the_topic_with_key_headers_and_count_under_auto() {
    retry_after_once(Commit::Auto).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_at_the_cap_the_copy_goes_to_the_dead_letter_topic_as_the_last_attempt_arrived() {
    let kafka = kafka().await;
    let (t, dead, group) = (unique("k7cap"), unique("k7dead"), unique("g"));
    create_topic(&t, 1).await;
    create_topic(&dead, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                handler(Arc::clone(&script)),
            )
            .max_attempts(3)
            .dead_letter(&dead),
        ),
    )
    .await;
    let mut headers = Headers::new();
    headers.insert("trace", "t-8");
    produce(&kafka, &t, Some("k"), b"\x00bytes\xff", &headers).await;
    let letters = read_topic(&dead, 1, 1, Duration::from_secs(30)).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(script.count(), 3, "exactly max_attempts runs");
    assert_eq!(
        script
            .calls()
            .iter()
            .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
            .collect::<Vec<_>>(),
        vec![None, Some("1".to_owned()), Some("2".to_owned())]
    );
    let letter = &letters[0];
    assert_eq!(&letter.payload[..], b"\x00bytes\xff");
    assert_eq!(letter.key.as_deref(), Some(&b"k"[..]));
    assert_eq!(letter.header("trace"), Some("t-8"));
    assert_eq!(
        letter.header(RETRY_COUNT_HEADER),
        Some("2"),
        "as the last attempt arrived"
    );
    // Original and two copies: all settled, the group is past them.
    committed_becomes(&group, &t, 0, 3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        read_topic(&dead, 1, 2, Duration::from_secs(1)).await.len(),
        1,
        "exactly one dead letter"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_at_the_cap_without_dead_letter_the_record_settles_and_nothing_is_produced() {
    let kafka = kafka().await;
    let (t, group) = (unique("k7go"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = start(
        App::new().register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2),
        ),
    )
    .await;
    produce(&kafka, &t, None, b"x", &Headers::new()).await;
    committed_becomes(&group, &t, 0, 2, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(script.count(), 2);
    assert_eq!(
        read_topic(&t, 1, 3, Duration::from_secs(2)).await.len(),
        2,
        "original and one copy only"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8_topics_and_partitions_without_a_retry_destination_refuse_to_start() {
    let kafka = kafka().await;
    let script = Script::new(|_| HandlerOutcome::ack());
    let err = App::new()
        .register(
            on(
                kafka.topics(["a", "b"]).group("g"),
                handler(Arc::clone(&script)),
            )
            .name("topics"),
        )
        .register(
            on(
                kafka.partitions([("a", 0, Offset::Beginning)]).group("g"),
                handler(Arc::clone(&script)),
            )
            .name("partitions")
            .max_attempts(3),
        )
        .register(
            on(
                kafka
                    .topic("c")
                    .group("g")
                    .commit(Commit::Tracked)
                    .set("enable.auto.offset.store", "true"),
                handler(Arc::clone(&script)),
            )
            .name("contradiction"),
        )
        .register(
            on(
                // Without .group(..) this would not compile; an empty group is refused.
                kafka
                    .topic("d")
                    .group("")
                    .set("enable.auto.commit", "false"),
                handler(Arc::clone(&script)),
            )
            .name("no-group"),
        )
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("registration `topics` on `a,b`") && err.contains(".retry_to(address)"),
        "{err}"
    );
    assert!(err.contains("registration `partitions` on `a/0`"), "{err}");
    assert!(err.contains("enable.auto.offset.store=true"), "{err}");
    assert!(
        err.contains("enable.auto.commit=false") && err.contains(".group(name)"),
        "{err}"
    );
    assert!(err.contains("5 rule(s) broken"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k8_topics_copies_go_to_the_named_destination() {
    let kafka = kafka().await;
    let (a, b, retry, group) = (unique("k8a"), unique("k8b"), unique("k8retry"), unique("g"));
    for t in [&a, &b, &retry] {
        create_topic(t, 1).await;
    }
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(50))
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = start(
        App::new().register(
            on(
                kafka
                    .topics([a.clone(), b.clone(), retry.clone()])
                    .group(&group)
                    .set("auto.commit.interval.ms", "100")
                    .set("session.timeout.ms", "6000")
                    .set("heartbeat.interval.ms", "500"),
                handler(Arc::clone(&script)),
            )
            .retry_to(&retry),
        ),
    )
    .await;
    produce(&kafka, &b, None, b"x", &Headers::new()).await;
    eventually(Duration::from_secs(30), "the copy is handled", || {
        script.count() == 2
    })
    .await;
    let calls = script.calls();
    assert_eq!(
        (calls[0].address.as_str(), calls[1].address.as_str()),
        (b.as_str(), retry.as_str())
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k9_every_group_reading_the_topic_receives_the_copy() {
    let kafka = kafka().await;
    let (t, retrying, other) = (unique("k9"), unique("retrying"), unique("other"));
    create_topic(&t, 2).await;
    let first = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry_after(Duration::from_millis(50))
        } else {
            HandlerOutcome::ack()
        }
    });
    let second = Script::new(|_| HandlerOutcome::ack());
    let app = start(
        App::new()
            .register(
                on(
                    topic(&kafka, &t, &retrying, Commit::Tracked),
                    handler(Arc::clone(&first)),
                )
                .name("retrying"),
            )
            .register(
                on(
                    topic(&kafka, &t, &other, Commit::Tracked),
                    handler(Arc::clone(&second)),
                )
                .name("other"),
            ),
    )
    .await;
    produce(&kafka, &t, Some("key"), b"x", &Headers::new()).await;
    eventually(
        Duration::from_secs(30),
        "both groups saw original and copy",
        || first.count() == 2 && second.count() == 2,
    )
    .await;
    let seen: Vec<Option<String>> = second
        .calls()
        .iter()
        .map(|c| c.headers.get_str(RETRY_COUNT_HEADER).map(str::to_owned))
        .collect();
    assert_eq!(seen, vec![None, Some("1".to_owned())]);
    assert_eq!(
        second.calls()[0].partition,
        second.calls()[1].partition,
        "same key, same partition"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracked_a_stop_during_a_delayed_retry_hands_the_original_back() {
    let kafka = kafka().await;
    let (t, group) = (unique("hold"), unique("g"));
    create_topic(&t, 1).await;
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(600)));
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Tracked),
        handler(Arc::clone(&script)),
    )))
    .await;
    produce(&kafka, &t, None, b"held", &Headers::new()).await;
    eventually(Duration::from_secs(30), "handled", || script.count() == 1).await;
    app.stop().await;
    assert_eq!(
        read_topic(&t, 1, 2, Duration::from_secs(2)).await.len(),
        1,
        "no copy was produced"
    );
    assert_eq!(
        committed(&group, &t, 0).await,
        None,
        "the original is not committed"
    );
    // The next instance gets the original again.
    let again = Script::new(|_| HandlerOutcome::ack());
    let app = start(App::new().register(on(
        topic(&kafka, &t, &group, Commit::Tracked),
        handler(Arc::clone(&again)),
    )))
    .await;
    eventually(Duration::from_secs(30), "the original came back", || {
        again.count() == 1
    })
    .await;
    assert_eq!(again.calls()[0].attempt, 1);
    committed_becomes(&group, &t, 0, 1, Duration::from_secs(10)).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_sets_key_headers_and_partition_and_errors_name_the_topic() {
    let kafka = kafka().await;
    let t = unique("pub");
    create_topic(&t, 3).await;
    let mut headers = Headers::new();
    headers.insert("h", "v");
    let landed = kafka
        .publisher()
        .send(&t, Some(b"k"), &headers, b"p", Some(2))
        .await
        .unwrap();
    assert_eq!(landed.partition, 2);
    let records = read_topic(&t, 3, 1, Duration::from_secs(10)).await;
    assert_eq!(
        (
            records[0].partition,
            records[0].key.as_deref(),
            records[0].header("h")
        ),
        (2, Some(&b"k"[..]), Some("v"))
    );
    let err = kafka
        .publisher()
        .send(&t, None, &Headers::new(), b"p", Some(99))
        .await
        .unwrap_err();
    assert_eq!(err.address(), t);
    assert!(err.to_string().contains(&t), "{err}");
}

/// The one publishing shape (`ruststream::Publisher`) on Kafka: key, header and the
/// partition as a typed option.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_common_publisher_carries_key_headers_and_the_partition_option() {
    let kafka = kafka().await;
    let t = unique("common-pub");
    create_topic(&t, 3).await;
    let publisher = ruststream::Publisher::new(kafka.publish_handle());
    publisher
        .to(&t)
        .key("k")
        .header("h", "v")
        .with(ruststream_kafka::Partition(1))
        .send(&serde_json::json!({"id": 1}))
        .await
        .unwrap();
    let records = read_topic(&t, 3, 1, Duration::from_secs(10)).await;
    assert_eq!(
        (
            records[0].partition,
            records[0].key.as_deref(),
            records[0].header("h")
        ),
        (1, Some(&b"k"[..]), Some("v"))
    );
}

/// Reads the group's committed offsets every 50 ms, with one consumer of its own.
fn watch_commits(
    group: &str,
    topic: &str,
    partitions: i32,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<(i32, i64, std::time::Instant)>> {
    use ruststream_kafka::rdkafka::TopicPartitionList;
    use ruststream_kafka::rdkafka::config::ClientConfig;
    use ruststream_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
    let (brokers, group, topic) = (common::brokers(), group.to_owned(), topic.to_owned());
    std::thread::spawn(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let mut samples = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let mut list = TopicPartitionList::new();
            for p in 0..partitions {
                list.add_partition(&topic, p);
            }
            if let Ok(offsets) = consumer.committed_offsets(list, Duration::from_secs(5)) {
                let at = std::time::Instant::now();
                for e in offsets.elements() {
                    if let Offset::Offset(o) = e.offset() {
                        samples.push((e.partition(), o, at));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::mem::forget(consumer);
        samples
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k5_a_member_joins_and_leaves_mid_run_and_no_commit_passes_unfinished_work() {
    let kafka = kafka().await;
    let (t, group) = (unique("k5"), unique("g"));
    create_topic(&t, 2).await;
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for n in 0..80u32 {
        let (p, o) = produce(
            &kafka,
            &t,
            Some(&format!("key-{}", n % 10)),
            n.to_string().as_bytes(),
            &Headers::new(),
        )
        .await;
        ends.insert(p, o + 1);
    }
    // When each (partition, offset) was first finished, by any member.
    let finished: Arc<Mutex<HashMap<(i32, i64), std::time::Instant>>> = Arc::default();
    let handler = {
        let finished = Arc::clone(&finished);
        move |d: ruststream::Delivery| {
            let finished = Arc::clone(&finished);
            async move {
                let (p, o) = (
                    d.metadata().partition.unwrap(),
                    d.metadata().offset.unwrap(),
                );
                // Some records outlive the rebalance, so they settle after the revoke.
                tokio::time::sleep(Duration::from_millis(if o % 7 == 0 { 400 } else { 40 })).await;
                finished
                    .lock()
                    .unwrap()
                    .entry((p, o))
                    .or_insert_with(std::time::Instant::now);
                HandlerOutcome::ack()
            }
        }
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = watch_commits(&group, &t, 2, Arc::clone(&stop));
    let first = start(
        App::new()
            .register(on(topic(&kafka, &t, &group, Commit::Tracked), handler.clone()).lanes(4)),
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "the first member is working",
        || finished.lock().unwrap().len() >= 8,
    )
    .await;
    let second = start(
        App::new()
            .register(on(topic(&kafka, &t, &group, Commit::Tracked), handler.clone()).lanes(4)),
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "half done with two members",
        || finished.lock().unwrap().len() >= 40,
    )
    .await;
    second.stop().await;
    eventually(Duration::from_secs(60), "all 80 finished", || {
        finished.lock().unwrap().len() == 80
    })
    .await;
    for (p, end) in &ends {
        committed_becomes(&group, &t, *p, *end, Duration::from_secs(30)).await;
    }
    first.stop().await;
    assert!(
        logs().contains("partitions revoked"),
        "a real rebalance happened"
    );
    // Deliveries read before their partition moved, settled after: they changed nothing.
    let late = logs()
        .lines()
        .filter(|l| l.contains("settled after its partition moved"))
        .count();
    assert!(late > 0, "a settlement read before a move arrived after it");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let samples = common::blocking(move || watcher.join().unwrap()).await;
    let finished = finished.lock().unwrap();
    assert!(samples.len() > 20, "the watcher saw the commits move");
    let sampled = samples.len();
    // A late settlement storing its old position would move a commit backwards.
    let mut highest: HashMap<i32, i64> = HashMap::new();
    for (p, committed, _) in &samples {
        let before = highest.entry(*p).or_insert(*committed);
        assert!(
            committed >= before,
            "the committed offset of partition {p} went back from {before} to {committed}"
        );
        *before = *committed;
    }
    for (p, committed, at) in samples {
        for offset in 0..committed {
            let done = finished.get(&(p, offset));
            assert!(
                done.is_some_and(|d| *d <= at),
                "committed offset {committed} on partition {p} passed offset {offset}, unfinished at that time"
            );
        }
    }
    // A line scripts/reliability collects into RELIABILITY.md.
    println!(
        "RELIABILITY|Kafka Commit::Tracked|80 records on 2 partitions, a second member joins and leaves mid-run (a real rebalance), {sampled} committed positions sampled, {late} settlements arriving after their partition moved|lost 0 of 80; no committed position passed unfinished work or went back|not counted here|none declared"
    );
}

/// Records waiting in the client's queue are kept whole and their headers read only when
/// asked: what a handler's `Headers` and `Attempt` see is what was produced, the attempt
/// is the retry-count header's (K7, D4), and a malformed count reads as the first attempt
/// and is logged, as when the headers were read at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_headers_read_on_request_are_the_records_own() {
    let kafka = kafka().await;
    let (t, group) = (unique("lazyhdr"), unique("g"));
    create_topic(&t, 1).await;
    let mut counted = Headers::new();
    counted
        .insert(RETRY_COUNT_HEADER, "2")
        .insert("trace", "abc");
    let mut malformed = Headers::new();
    malformed.insert(RETRY_COUNT_HEADER, "bogus");
    // Produced before the app starts: a backlog the consumer finds in its queue.
    for (payload, headers) in [
        (&b"counted"[..], &counted),
        (b"plain", &Headers::new()),
        (b"malformed", &malformed),
        (b"unread", &counted),
    ] {
        produce(&kafka, &t, None, payload, headers).await;
    }
    type Seen = Arc<Mutex<Vec<(String, u32, Option<String>, usize)>>>;
    let seen: Seen = Arc::default();
    let app = start(App::new().state(Arc::clone(&seen)).register(on(
        topic(&kafka, &t, &group, Commit::Tracked),
        async |ruststream::Payload(payload): ruststream::Payload,
               headers: Option<Headers>,
               attempt: Option<ruststream::Attempt>,
               ruststream::State(seen): ruststream::State<Seen>| {
            let payload = String::from_utf8_lossy(&payload).into_owned();
            // The last one asks for nothing: it is acked without its headers read.
            if payload != "unread" {
                let headers = headers.expect("headers");
                let trace = headers
                    .get("trace")
                    .map(|v| String::from_utf8_lossy(v).into_owned());
                let attempt = attempt.expect("attempt").number();
                seen.lock()
                    .unwrap()
                    .push((payload, attempt, trace, headers.len()));
            } else {
                seen.lock().unwrap().push((payload, 0, None, 0));
            }
            HandlerOutcome::ack()
        },
    )))
    .await;
    eventually(Duration::from_secs(30), "all four handled", || {
        seen.lock().unwrap().len() == 4
    })
    .await;
    committed_becomes(&group, &t, 0, 4, Duration::from_secs(10)).await;
    app.stop().await;
    assert_eq!(
        *seen.lock().unwrap(),
        [
            ("counted".to_owned(), 3, Some("abc".to_owned()), 2),
            ("plain".to_owned(), 1, None, 0),
            ("malformed".to_owned(), 1, None, 1),
            ("unread".to_owned(), 0, None, 0),
        ]
    );
    assert!(
        logs().contains("counting it as the first attempt"),
        "the malformed count is logged when read"
    );
}

/// Records found in the client's queue are kept whole and decoded where they are; what
/// leaves the handler with them (a delayed copy, a dead letter) carries their bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_a_record_kept_whole_is_decoded_in_place_and_its_copies_carry_its_bytes() {
    #[derive(serde::Deserialize)]
    struct N {
        n: u32,
    }
    let kafka = kafka().await;
    let (t, dead, group) = (unique("inplace"), unique("inplacedead"), unique("g"));
    create_topic(&t, 1).await;
    create_topic(&dead, 1).await;
    // A backlog the consumer finds in its queue.
    for payload in [&b"{\"n\":1}"[..], b"{\"n\":2}", b"\x00not json\xff"] {
        produce(&kafka, &t, None, payload, &Headers::new()).await;
    }
    type Seen = Arc<Mutex<Vec<(u32, u32)>>>;
    let seen: Seen = Arc::default();
    let app = start(
        App::new().state(Arc::clone(&seen)).register(
            on(
                topic(&kafka, &t, &group, Commit::Tracked),
                async |ruststream::Message(N { n }): ruststream::Message<N>,
                       attempt: ruststream::Attempt,
                       ruststream::State(seen): ruststream::State<Seen>| {
                    seen.lock().unwrap().push((n, attempt.number()));
                    if n == 2 && attempt.number() == 1 {
                        HandlerOutcome::retry_after(Duration::from_millis(200))
                    } else {
                        HandlerOutcome::ack()
                    }
                },
            )
            .max_attempts(3)
            .dead_letter(&dead),
        ),
    )
    .await;
    let letters = read_topic(&dead, 1, 1, Duration::from_secs(30)).await;
    assert_eq!(letters.len(), 1, "the undecodable record, dead-lettered");
    assert_eq!(&letters[0].payload[..], b"\x00not json\xff");
    eventually(Duration::from_secs(30), "the copy is handled", || {
        seen.lock().unwrap().len() == 3
    })
    .await;
    assert_eq!(*seen.lock().unwrap(), [(1, 1), (2, 1), (2, 2)]);
    let records = read_topic(&t, 1, 4, Duration::from_secs(10)).await;
    let copy = records.iter().find(|r| r.offset == 3).expect("the copy");
    assert_eq!(&copy.payload[..], b"{\"n\":2}", "the delayed copy's bytes");
    assert_eq!(copy.header(RETRY_COUNT_HEADER), Some("1"));
    committed_becomes(&group, &t, 0, 4, Duration::from_secs(10)).await;
    app.stop().await;
}

/// D1 on Kafka `Auto` (issue #47): the offset was stored at hand-over, so a retry copy
/// waiting out its `retry_after` at a graceful stop is published at once instead of being
/// lost with the process; the topic then holds the original and its copy (count 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_a_graceful_stop_publishes_a_waiting_auto_copy_early() {
    let kafka = kafka().await;
    let (t, group) = (unique("d1auto"), unique("g"));
    create_topic(&t, 1).await;
    produce(&kafka, &t, Some("k"), b"wait", &Headers::new()).await;
    let script = Script::new(|_| HandlerOutcome::retry_after(Duration::from_secs(120)));
    let app = App::new()
        .register(
            on(
                topic(&kafka, &t, &group, Commit::Auto),
                handler(Arc::clone(&script)),
            )
            .max_attempts(3),
        )
        .start()
        .await
        .expect("start");
    eventually(Duration::from_secs(30), "handled", || script.count() == 1).await;
    let stopped = std::time::Instant::now();
    app.stop().await;
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "not held for the 120 s"
    );
    let records = read_topic(&t, 1, 2, Duration::from_secs(20)).await;
    assert_eq!(records.len(), 2, "the original and its copy");
    let copy = &records[1];
    assert_eq!(&copy.payload[..], b"wait");
    assert_eq!(copy.key.as_deref(), Some(&b"k"[..]));
    let count = copy
        .headers
        .iter()
        .find(|(name, _)| name == RETRY_COUNT_HEADER)
        .map(|(_, value)| value.clone());
    assert_eq!(count.as_deref(), Some(&b"1"[..]), "the copy counts 1");
}
