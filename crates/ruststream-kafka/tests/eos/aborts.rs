//! K6: where an aborted window is read again from.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream::{App, Delivery, HandlerOutcome, Headers, Publisher, on};
use ruststream_core::StartAt;
use ruststream_kafka::EosPipeline;

use crate::common::{committed_becomes, create_topic, kafka, produce, read_topic, unique};
use crate::support::{start, transactional};

/// What a test's handler answers for a payload (and whether it is its first run): after
/// how long, and what.
type Decide = fn(&str, bool) -> (Duration, HandlerOutcome);

/// A handler that records each payload it is given, relays it to `output` through the
/// pipeline, then answers as `decide` says.
fn relaying(
    output: String,
    seen: Arc<Mutex<Vec<String>>>,
    decide: Decide,
) -> impl Fn(Delivery, Publisher) -> Pin<Box<dyn Future<Output = HandlerOutcome> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |d: Delivery, publisher: Publisher| {
        let (log, out) = (Arc::clone(&seen), output.clone());
        Box::pin(async move {
            let payload = String::from_utf8_lossy(d.payload()).into_owned();
            let first = {
                let mut log = log.lock().unwrap();
                log.push(payload.clone());
                log.iter().filter(|p| **p == payload).count() == 1
            };
            if publisher
                .to(&out)
                .send_bytes(payload.clone())
                .await
                .is_err()
            {
                return HandlerOutcome::retry();
            }
            let (pause, outcome) = decide(&payload, first);
            tokio::time::sleep(pause).await;
            outcome
        })
    }
}

/// A group that started at the latest record and aborts its first window has no
/// committed position to go back to: the window is read again from its own first record,
/// not from the topic's beginning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_an_abort_before_any_commit_reads_again_from_the_windows_first_record() {
    let kafka = kafka().await;
    let (input, output, group) = (unique("eos-first-in"), unique("eos-first-out"), unique("g"));
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    for old in ["old-0", "old-1", "old-2"] {
        produce(&kafka, &input, None, old.as_bytes(), &Headers::new()).await;
    }
    // A long interval: the probe and the retried record share the first window.
    let pipeline = EosPipeline::new(&kafka, unique("tx")).commit_interval(Duration::from_secs(5));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = relaying(output.clone(), Arc::clone(&seen), |payload, first| {
        // The retried record aborts the window.
        let outcome = if payload == "retried" && first {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        };
        (Duration::ZERO, outcome)
    });
    let app = start(App::new().register(on(
        transactional(&kafka, &input, &group, &pipeline).start_at(StartAt::Latest),
        handler,
    )))
    .await;
    // Probes until one is read: the group has taken its partition at the latest record.
    let mut probes: i64 = 0;
    while !seen.lock().unwrap().iter().any(|p| p.starts_with("probe")) {
        assert!(probes < 60, "no probe read in 30 s");
        produce(
            &kafka,
            &input,
            None,
            format!("probe-{probes}").as_bytes(),
            &Headers::new(),
        )
        .await;
        probes += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    produce(&kafka, &input, None, b"retried", &Headers::new()).await;
    let end = 3 + probes + 1;
    committed_becomes(&group, &input, 0, end, Duration::from_secs(60)).await;
    app.stop().await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().filter(|p| *p == "retried").count() >= 2,
        "the window was aborted and read again: {seen:?}"
    );
    assert!(
        !seen.iter().any(|p| p.starts_with("old")),
        "records before the group's start were read after the abort: {seen:?}"
    );
}

/// A record waiting out `retry_after` was read in an earlier window; its copy is produced,
/// and the record settled, in the window open when its wait ends. When that window
/// aborts, the copy is undone, so the record is read again, though the window read
/// nothing else of its partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_d2_an_abort_reads_again_a_delayed_original_that_settled_in_the_window() {
    let kafka = kafka().await;
    let (input, output, retries, group) = (
        unique("eos-held-in"),
        unique("eos-held-out"),
        unique("eos-held-retries"),
        unique("g"),
    );
    create_topic(&input, 2).await;
    create_topic(&output, 1).await;
    create_topic(&retries, 1).await;
    let pipeline = EosPipeline::new(&kafka, unique("tx"));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = relaying(output.clone(), Arc::clone(&seen), |payload, first| {
        match payload {
            "held" if first => (
                Duration::ZERO,
                HandlerOutcome::retry_after(Duration::from_secs(1)),
            ),
            // Running while the held record's copy is made: then aborts.
            "aborting" if first => (Duration::from_secs(2), HandlerOutcome::retry()),
            _ => (Duration::ZERO, HandlerOutcome::ack()),
        }
    });
    let app = start(
        App::new().register(
            on(transactional(&kafka, &input, &group, &pipeline), handler)
                // Copies go where this subscription does not read (tansu shows aborted
                // records to every reader).
                .retry_to(retries.as_str())
                .lanes(4),
        ),
    )
    .await;
    let send = |payload: &'static str, partition: i32| {
        let (kafka, input) = (kafka.clone(), input.clone());
        async move {
            kafka
                .publisher()
                .send(
                    &input,
                    Some(payload.as_bytes()),
                    &Headers::new(),
                    payload.as_bytes(),
                    Some(partition),
                )
                .await
                .expect("produce");
        }
    };
    send("held", 0).await;
    send("closes-a-window", 1).await;
    // The first window commits the second record; the held one keeps partition 0 back.
    committed_becomes(&group, &input, 1, 1, Duration::from_secs(60)).await;
    send("aborting", 1).await;
    committed_becomes(&group, &input, 1, 2, Duration::from_secs(60)).await;
    committed_becomes(&group, &input, 0, 1, Duration::from_secs(60)).await;
    app.stop().await;
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.iter().filter(|p| *p == "aborting").count() >= 2,
        "the window aborted and was read again: {seen:?}"
    );
    assert!(
        seen.iter().filter(|p| *p == "held").count() >= 2,
        "the held record's copy was undone with the window, and the record not read again: {seen:?}"
    );
}

/// A record waiting out `retry_after` (read in an earlier window, its partition's
/// position held at it) is read again when a later window that read its partition aborts
/// and rewinds to the group's committed position: its first wait then makes no copy, so
/// one copy is made in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_d2_a_wait_whose_record_an_abort_reads_again_makes_no_copy() {
    let seen = wait_then_abort(true).await;
    assert!(
        seen.iter().filter(|p| *p == "held").count() >= 2,
        "the abort read the waiting record again: {seen:?}"
    );
}

/// The same when the group has committed no position for the partition yet: the abort
/// rewinds far enough back to read the waiting record again (its first wait makes no
/// copy, so nothing else would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_d2_an_abort_before_any_commit_keeps_a_waiting_record() {
    wait_then_abort(false).await;
}

/// A record waits out `retry_after` while a later window aborts; returns the payloads
/// handled. Checks that one copy of the waiting record was made and both records settled.
async fn wait_then_abort(commit_first: bool) -> Vec<String> {
    let kafka = kafka().await;
    let (input, output, retries, group) = (
        unique("eos-rewait-in"),
        unique("eos-rewait-out"),
        unique("eos-rewait-retries"),
        unique("g"),
    );
    for topic in [&input, &output, &retries] {
        create_topic(topic, 1).await;
    }
    let pipeline = EosPipeline::new(&kafka, unique("tx"));
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let handler = relaying(output.clone(), Arc::clone(&seen), |payload, first| {
        match payload {
            // Every read of it waits (its copies go where this subscription does not read).
            "held" => (
                Duration::ZERO,
                HandlerOutcome::retry_after(Duration::from_secs(3)),
            ),
            "aborting" if first => (Duration::ZERO, HandlerOutcome::retry()),
            _ => (Duration::ZERO, HandlerOutcome::ack()),
        }
    });
    let app = start(
        App::new().register(
            on(transactional(&kafka, &input, &group, &pipeline), handler)
                .retry_to(retries.as_str())
                .lanes(2),
        ),
    )
    .await;
    let mut end = 2;
    if commit_first {
        produce(&kafka, &input, None, b"first", &Headers::new()).await;
        committed_becomes(&group, &input, 0, 1, Duration::from_secs(60)).await;
        end += 1;
    }
    produce(&kafka, &input, None, b"held", &Headers::new()).await;
    // The window that read "held" closes (its output commits; the position waits at it).
    tokio::time::sleep(Duration::from_millis(800)).await;
    produce(&kafka, &input, None, b"aborting", &Headers::new()).await;
    // Both settled: the position passes them once a wait's copy is made.
    committed_becomes(&group, &input, 0, end, Duration::from_secs(60)).await;
    // Every wait has ended by now.
    tokio::time::sleep(Duration::from_secs(4)).await;
    app.stop().await;
    let seen = seen.lock().unwrap().clone();
    let copies = read_topic(&retries, 1, 3, Duration::from_secs(5)).await;
    let payloads: Vec<_> = copies.iter().map(|r| r.payload.to_vec()).collect();
    assert_eq!(
        payloads,
        vec![b"held".to_vec()],
        "one copy of the waiting record, made by the wait of its last read: {seen:?}"
    );
    seen
}
