//! K5: a member joins and leaves mid-run, and no commit passes unfinished work.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{
    committed_becomes, create_topic, eventually, group_stable, kafka, logs, produce, topic, unique,
};
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_kafka::{Commit, Offset};

use crate::support::start;

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
    let (brokers, group, topic) = (crate::common::brokers(), group.to_owned(), topic.to_owned());
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
    // Past the first 8, records wait until the second member has joined the group: the
    // rebalance comes while they run, and the second member leaves a formed group.
    let held = Arc::new(AtomicBool::new(true));
    let handler = {
        let (finished, held) = (Arc::clone(&finished), Arc::clone(&held));
        move |d: ruststream::Delivery| {
            let (finished, held) = (Arc::clone(&finished), Arc::clone(&held));
            async move {
                let (p, o) = (
                    d.metadata().partition.unwrap(),
                    d.metadata().offset.unwrap(),
                );
                // Within the handler deadline (30 s) whatever happens.
                let until = std::time::Instant::now() + Duration::from_secs(25);
                while finished.lock().unwrap().len() >= 8
                    && held.load(Ordering::SeqCst)
                    && std::time::Instant::now() < until
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
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
    group_stable(&group, 2, Duration::from_secs(20)).await;
    held.store(false, Ordering::SeqCst);
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
    let samples = crate::common::blocking(move || watcher.join().unwrap()).await;
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

/// A member whose handler is slow, with a delivery waiting behind it for its lane, still
/// takes part in a rebalance: a second member gets its partition and works while the
/// handler runs (the whole group would wait for the lane to free otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k5_a_member_whose_delivery_waits_for_its_lane_still_takes_part_in_a_rebalance() {
    let kafka = kafka().await;
    let (t, group) = (unique("k5-lane"), unique("g"));
    create_topic(&t, 2).await;
    // Records on both partitions: whichever the second member gets, it has some.
    let (publisher, none) = (kafka.publisher(), Headers::new());
    for partition in [0, 1, 0, 1, 0, 1, 0, 1] {
        let sent = publisher.send(&t, None, &none, b"r", Some(partition));
        sent.await.expect("produce");
    }
    // The first record runs until the test lets it go (within its deadline); the others
    // are counted as they finish.
    #[derive(Default)]
    struct Run {
        slow_started: AtomicBool,
        released: AtomicBool,
        finished: std::sync::atomic::AtomicUsize,
    }
    let run = Arc::new(Run::default());
    let handler = {
        let run = Arc::clone(&run);
        move |_: ruststream::Delivery| {
            let run = Arc::clone(&run);
            async move {
                if !run.slow_started.swap(true, Ordering::SeqCst) {
                    let until = std::time::Instant::now() + Duration::from_secs(50);
                    while !run.released.load(Ordering::SeqCst) && std::time::Instant::now() < until
                    {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    return HandlerOutcome::ack();
                }
                run.finished.fetch_add(1, Ordering::SeqCst);
                HandlerOutcome::ack()
            }
        }
    };
    let member = || {
        let registration = on(topic(&kafka, &t, &group, Commit::Tracked), handler.clone());
        App::new().register(registration.lanes(1).timeout(Duration::from_secs(60)))
    };
    let first = start(member()).await;
    eventually(Duration::from_secs(30), "the slow record runs", || {
        run.slow_started.load(Ordering::SeqCst)
    })
    .await;
    // The next record is fetched and waits for the one lane.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        run.finished.load(Ordering::SeqCst),
        0,
        "the first member's lane is held"
    );
    let second = start(member()).await;
    // Only the second member can finish a record while the slow one runs (50 s), and
    // only once the rebalance gave it a partition.
    eventually(
        Duration::from_secs(30),
        "the second member works while the slow handler runs",
        || run.finished.load(Ordering::SeqCst) > 0,
    )
    .await;
    run.released.store(true, Ordering::SeqCst);
    second.stop().await;
    first.stop().await;
}

/// Under load a member stores its settled positions once for many records (K3, see
/// docs/kafka.md); a revoke stores what waits before librdkafka commits the partitions
/// away, so the members after the rebalance read again only what was still running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_k5_a_revoke_under_load_hands_over_everything_that_settled() {
    use ruststream::Publisher;
    use ruststream::core::Outgoing;
    let kafka = kafka().await;
    let (t, group) = (unique("k5-load"), unique("g"));
    create_topic(&t, 2).await;
    let total = 12_000_usize;
    let messages = (0..total).map(|n| {
        let mut message = Outgoing::new(t.as_str(), n.to_string());
        message.key = Some(format!("key-{}", n % 16).into());
        message
    });
    let sent = Publisher::new(kafka.publish_handle())
        .send_all(messages)
        .await;
    assert!(sent.iter().all(Result::is_ok), "the backlog was written");
    // How many times each payload was handled, by either member.
    let handled: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let handler = {
        let handled = Arc::clone(&handled);
        move |d: ruststream::Delivery| {
            let handled = Arc::clone(&handled);
            async move {
                // Done in its first poll, like most handlers under load (a handler that
                // waits lets the member store at every wait), and slow enough that the
                // backlog outlasts the second member's join.
                std::thread::sleep(Duration::from_micros(700));
                let payload = String::from_utf8_lossy(d.payload()).into_owned();
                *handled.lock().unwrap().entry(payload).or_default() += 1;
                HandlerOutcome::ack()
            }
        }
    };
    let member = || {
        App::new()
            .register(on(topic(&kafka, &t, &group, Commit::Tracked), handler.clone()).lanes(1))
    };
    let first = start(member()).await;
    eventually(
        Duration::from_secs(30),
        "the first member is working",
        || handled.lock().unwrap().len() >= 1_000,
    )
    .await;
    let second = start(member()).await;
    eventually(
        Duration::from_secs(120),
        "the whole backlog handled",
        || handled.lock().unwrap().len() == total,
    )
    .await;
    let at_rebalance = handled.lock().unwrap().len();
    second.stop().await;
    first.stop().await;
    assert!(
        logs().contains("partitions revoked"),
        "a real rebalance happened"
    );
    let again = handled.lock().unwrap().values().filter(|n| **n > 1).count();
    // With one lane, at most the running delivery, the one queued behind it and the one
    // fetched for it were not settled at the revoke.
    assert!(
        again <= 3,
        "{again} records were handled again after the rebalance ({at_rebalance} handled in all)"
    );
}

/// Under `Tracked` a record waiting out `retry_after` keeps its partition's position (D2);
/// when the partition moves during the wait the record is read again (by the new owner,
/// or by this member after an eager rebalance) and waits again, and the first wait makes
/// no copy: one copy per record in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k5_d2_a_wait_whose_partition_moves_makes_no_copy() {
    use crate::common::read_topic;
    let kafka = kafka().await;
    let (t, retries, group) = (unique("k5-wait"), unique("k5-wait-retries"), unique("g"));
    create_topic(&t, 2).await;
    create_topic(&retries, 1).await;
    let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let reads = Arc::clone(&reads);
        move |_: ruststream::Delivery| {
            reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // Longer than the second member's join.
            async { HandlerOutcome::retry_after(Duration::from_secs(8)) }
        }
    };
    let member = || {
        App::new().register(
            on(topic(&kafka, &t, &group, Commit::Tracked), handler.clone())
                .retry_to(retries.as_str()),
        )
    };
    let first = start(member()).await;
    for (payload, partition) in [("held-0", 0), ("held-1", 1)] {
        let (publisher, headers) = (kafka.publisher(), Headers::new());
        let sent = publisher.send(&t, None, &headers, payload.as_bytes(), Some(partition));
        sent.await.expect("produce");
    }
    eventually(Duration::from_secs(30), "both records read", || {
        reads.load(std::sync::atomic::Ordering::SeqCst) >= 2
    })
    .await;
    let second = start(member()).await;
    eventually(Duration::from_secs(60), "both records read again", || {
        reads.load(std::sync::atomic::Ordering::SeqCst) >= 4
    })
    .await;
    // Every wait has ended, the first ones long since.
    let copies = read_topic(&retries, 1, 3, Duration::from_secs(20)).await;
    second.stop().await;
    first.stop().await;
    assert!(
        logs().contains("partitions revoked"),
        "a real rebalance happened"
    );
    let mut payloads: Vec<_> = copies.iter().map(|r| r.payload.to_vec()).collect();
    payloads.sort();
    assert_eq!(
        payloads,
        vec![b"held-0".to_vec(), b"held-1".to_vec()],
        "one copy per record, made by the wait of its last read"
    );
}
