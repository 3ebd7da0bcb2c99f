//! `Commit::Transactional` + `EosPipeline` against a real Kafka-API broker (SPEC K6).
//!
//! Tansu does not hide records of aborted transactions from `read_committed` consumers,
//! so "each output exactly once, as a consumer honouring transaction markers sees it" is
//! checked only by `k6_read_committed_sees_each_output_exactly_once`, which needs a real
//! Kafka named by `RUSTSTREAM_REAL_KAFKA_BROKERS`; the test command leaves it out (and
//! says so) when that is not set. Everything else runs against tansu.

// The helpers every test binary of this crate shares, in `tests/common/`.
#[path = "../common/mod.rs"]
mod common;
mod support;

mod aborts;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{
    committed, committed_becomes, create_topic, eventually, kafka, logs, produce, read_topic,
    unique,
};
use ruststream::{App, Delivery, HandlerOutcome, Headers, Publisher, on};
use ruststream_kafka::{Commit, EosPipeline, Kafka, WindowReport};
use support::{collect, produce_numbered, start, transactional, transform};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_outputs_and_input_offsets_advance_together() {
    let kafka = kafka().await;
    let (input, output, group) = (unique("eos-in"), unique("eos-out"), unique("g"));
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    let pipeline =
        EosPipeline::new(&kafka, unique("tx")).commit_interval(Duration::from_millis(100));
    let reports = collect(&pipeline);
    let calls: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let app = start(App::new().register(on(
        transactional(&kafka, &input, &group, &pipeline),
        transform(output.clone(), Arc::clone(&calls), None),
    )))
    .await;
    produce_numbered(&kafka, &input, 30).await;
    committed_becomes(&group, &input, 0, 30, Duration::from_secs(60)).await;
    app.stop().await;
    let reports = reports.lock().unwrap().clone();
    let committed_windows: Vec<&WindowReport> = reports
        .iter()
        .map(|(r, _)| r)
        .filter(|r| r.committed)
        .collect();
    // A rebalance right after the group forms may abort (and replay) the first window.
    let aborted = reports.iter().filter(|(r, _)| !r.committed).count();
    assert!(committed_windows.len() >= 2, "several windows: {reports:?}");
    // Each committed window's offset covers exactly the inputs whose outputs it carried.
    let mut inputs_covered = 0i64;
    for window in &committed_windows {
        if let Some((_, _, next)) = window.offsets.first() {
            assert_eq!(
                *next - inputs_covered,
                window.records as i64,
                "window {}: offsets and outputs differ",
                window.number
            );
            inputs_covered = *next;
        } else {
            assert_eq!(
                window.records, 0,
                "outputs committed without their inputs' offsets"
            );
        }
    }
    assert_eq!(inputs_covered, 30);
    let outputs = read_topic(&output, 1, 30, Duration::from_secs(10)).await;
    let mut seen: Vec<String> = outputs
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect();
    seen.sort();
    if aborted == 0 {
        assert_eq!(
            seen.len(),
            30,
            "no window aborted, so no output was produced twice"
        );
    }
    seen.dedup();
    let mut expected: Vec<String> = (0..30).map(|i| format!("out-{i}")).collect();
    expected.sort();
    assert_eq!(seen, expected);
    // Each transaction leaves a marker in the output partition: the offsets have gaps.
    let last = outputs.iter().map(|r| r.offset).max().unwrap();
    assert!(
        last >= 30,
        "markers take offsets between the windows' records (last offset {last})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_retry_aborts_the_window_within_one_interval_and_reads_it_again() {
    let kafka = kafka().await;
    let (input, output, group) = (unique("eos-retry-in"), unique("eos-retry-out"), unique("g"));
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    let interval = Duration::from_millis(300);
    let pipeline = EosPipeline::new(&kafka, unique("tx")).commit_interval(interval);
    let reports = collect(&pipeline);
    let calls: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    produce_numbered(&kafka, &input, 10).await;
    let app = start(App::new().register(on(
        transactional(&kafka, &input, &group, &pipeline),
        transform(output.clone(), Arc::clone(&calls), Some(4)),
    )))
    .await;
    committed_becomes(&group, &input, 0, 10, Duration::from_secs(60)).await;
    app.stop().await;
    let reports = reports.lock().unwrap().clone();
    let calls = calls.lock().unwrap().clone();
    let (aborted, aborted_at) = reports
        .iter()
        .find(|(r, _)| !r.committed)
        .cloned()
        .expect("a window aborted");
    assert!(
        aborted.offsets.is_empty(),
        "an aborted window commits no offset"
    );
    let retried_at = calls
        .iter()
        .filter(|(o, _)| *o == 4)
        .map(|(_, at)| *at)
        .next()
        .unwrap();
    assert!(
        aborted_at - retried_at <= interval + Duration::from_millis(700),
        "aborted {:?} after the retry, not within one commit interval",
        aborted_at - retried_at
    );
    let mut runs: HashMap<i64, usize> = HashMap::new();
    for (offset, _) in &calls {
        *runs.entry(*offset).or_default() += 1;
    }
    assert!(runs[&4] >= 2, "the retried record was handled again");
    assert!(
        (0..10).all(|o| runs.contains_key(&o)),
        "every input handled: {runs:?}"
    );
    // Its window was read again from the last committed position: everything the aborted
    // window had read since then ran again.
    let earlier: Vec<i64> = calls
        .iter()
        .filter(|(_, at)| *at <= retried_at)
        .map(|(o, _)| *o)
        .collect();
    let committed_before: i64 = reports
        .iter()
        .filter(|(r, at)| r.committed && *at < retried_at)
        .filter_map(|(r, _)| r.offsets.first().map(|(_, _, o)| *o))
        .max()
        .unwrap_or(0);
    for offset in earlier.into_iter().filter(|o| *o >= committed_before) {
        assert!(
            runs[&offset] >= 2,
            "offset {offset} of the aborted window was not read again: {runs:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_filter_only_handler_commits_its_offsets_within_one_interval() {
    let kafka = kafka().await;
    let (input, group) = (unique("eos-filter"), unique("g"));
    create_topic(&input, 1).await;
    let interval = Duration::from_millis(300);
    let pipeline = EosPipeline::new(&kafka, unique("tx")).commit_interval(interval);
    let reports = collect(&pipeline);
    let last_call: Arc<Mutex<Option<Instant>>> = Arc::default();
    let handler = {
        let last_call = Arc::clone(&last_call);
        move |_d: Delivery| {
            let last_call = Arc::clone(&last_call);
            async move {
                *last_call.lock().unwrap() = Some(Instant::now());
                HandlerOutcome::ack()
            }
        }
    };
    let app = start(App::new().register(on(
        transactional(&kafka, &input, &group, &pipeline),
        handler,
    )))
    .await;
    produce_numbered(&kafka, &input, 5).await;
    eventually(
        Duration::from_secs(30),
        "a window committed offset 5",
        || {
            reports
                .lock()
                .unwrap()
                .iter()
                .any(|(r, _)| r.offsets.iter().any(|(_, _, o)| *o == 5))
        },
    )
    .await;
    let committed_at = reports
        .lock()
        .unwrap()
        .iter()
        .find(|(r, _)| r.offsets.iter().any(|(_, _, o)| *o == 5))
        .map(|(_, at)| *at)
        .unwrap();
    let handled_at = last_call.lock().unwrap().unwrap();
    assert!(
        committed_at - handled_at <= interval + Duration::from_millis(700),
        "committed {:?} after the last record was handled",
        committed_at - handled_at
    );
    assert_eq!(
        committed(&group, &input, 0).await,
        Some(5),
        "the broker has the window's offsets"
    );
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_second_pipeline_with_the_same_id_fences_the_first_which_stops() {
    let kafka = kafka().await;
    let (input, group, id) = (unique("eos-fence"), unique("g"), unique("tx"));
    create_topic(&input, 1).await;
    let handler = |_d: Delivery| async { HandlerOutcome::ack() };
    let first_pipeline = EosPipeline::new(&kafka, &id);
    let first = start(App::new().register(on(
        transactional(&kafka, &input, &group, &first_pipeline),
        handler,
    )))
    .await;
    produce(&kafka, &input, None, b"a", &Headers::new()).await;
    committed_becomes(&group, &input, 0, 1, Duration::from_secs(30)).await;
    let second_pipeline = EosPipeline::new(&kafka, &id);
    let second = start(App::new().register(on(
        transactional(&kafka, &input, &unique("g2"), &second_pipeline),
        handler,
    )))
    .await;
    produce(&kafka, &input, None, b"b", &Headers::new()).await;
    eventually(
        Duration::from_secs(30),
        "the first pipeline stops, fenced",
        || logs().contains("another EosPipeline with this transactional id took over"),
    )
    .await;
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_transactional_subscription_refuses_auto_commit_and_a_pipeline_serves_one() {
    let kafka = kafka().await;
    let pipeline = EosPipeline::new(&kafka, unique("tx"));
    let handler = |_d: Delivery| async { HandlerOutcome::ack() };
    // A transactional subscription without a pipeline cannot be written
    // (`Commit::Transactional` holds it: a compile_fail doc test on `Commit`).
    let err = App::new()
        .register(
            on(
                kafka
                    .topic("c")
                    .group("g")
                    .commit(Commit::Transactional(pipeline.clone()))
                    .set("enable.auto.commit", "true"),
                handler,
            )
            .name("auto-commit"),
        )
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`auto-commit` on `c`") && err.contains("enable.auto.commit=true"),
        "{err}"
    );

    // One pipeline, two subscriptions: the second is refused at start, by name.
    let (first, second) = (unique("in"), unique("in"));
    create_topic(&first, 1).await;
    create_topic(&second, 1).await;
    let err = App::new()
        .register(
            on(
                transactional(&kafka, &first, &unique("g"), &pipeline),
                handler,
            )
            .name("one"),
        )
        .register(
            on(
                transactional(&kafka, &second, &unique("g"), &pipeline),
                handler,
            )
            .name("two"),
        )
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!(
            "the EosPipeline `{}` already serves another subscription",
            pipeline.id()
        )),
        "{err}"
    );
}

/// Needs a real Kafka (`RUSTSTREAM_REAL_KAFKA_BROKERS`): tansu shows aborted records to
/// `read_committed` consumers. The test command runs it only when that is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_read_committed_sees_each_output_exactly_once() {
    let brokers = std::env::var("RUSTSTREAM_REAL_KAFKA_BROKERS")
        .expect("RUSTSTREAM_REAL_KAFKA_BROKERS must name a real Kafka for this test (scripts/test leaves it out otherwise)");
    let kafka = Kafka::connect(&brokers).expect("client");
    // SAFETY of the helpers below: they read RUSTSTREAM_KAFKA_BROKERS.
    assert_eq!(
        common::brokers(),
        brokers,
        "point RUSTSTREAM_KAFKA_BROKERS at the same real Kafka"
    );
    let (input, output, group) = (unique("eos-rc-in"), unique("eos-rc-out"), unique("g"));
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    let pipeline =
        EosPipeline::new(&kafka, unique("tx")).commit_interval(Duration::from_millis(200));
    let calls: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    produce_numbered(&kafka, &input, 10).await;
    let app = start(App::new().register(on(
        transactional(&kafka, &input, &group, &pipeline),
        transform(output.clone(), Arc::clone(&calls), Some(4)),
    )))
    .await;
    committed_becomes(&group, &input, 0, 10, Duration::from_secs(60)).await;
    app.stop().await;
    let seen = common::read_committed(&output, 10, Duration::from_secs(10)).await;
    let mut payloads: Vec<String> = seen
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect();
    payloads.sort();
    let mut expected: Vec<String> = (0..10).map(|i| format!("out-{i}")).collect();
    expected.sort();
    assert_eq!(payloads, expected, "each input's output exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_failed_produce_aborts_the_window_even_if_the_handler_acks() {
    let f = fresh("eos-fail").await;
    let failed_once = Arc::new(Mutex::new(false));
    let handler = {
        let (output, failed_once) = (f.output.clone(), Arc::clone(&failed_once));
        move |_d: Delivery, publisher: Publisher| {
            let (output, failed_once) = (output.clone(), Arc::clone(&failed_once));
            async move {
                let first = !std::mem::replace(&mut *failed_once.lock().unwrap(), true);
                // An illegal topic name: the broker refuses the record. The handler
                // ignores the error and acks, yet the window must not commit.
                let topic = if first {
                    "illegal topic name!"
                } else {
                    output.as_str()
                };
                let _ = publisher.to(topic).send_bytes("x").await;
                HandlerOutcome::ack()
            }
        }
    };
    three_committed(&f, handler).await;
    one_abort_then_all_committed(&f.reports, 3);
}

/// K6: a produce whose report its caller stopped waiting for may still land in the open
/// transaction, and the caller may send it again (the runtime's copies try again after a
/// timeout): the window aborts and is read again, as for a failed produce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_produce_given_up_before_its_report_aborts_the_window() {
    let f = fresh("eos-given-up").await;
    let gave_up = Arc::new(Mutex::new(None::<bool>));
    let handler = {
        let (output, gave_up) = (f.output.clone(), Arc::clone(&gave_up));
        move |_d: Delivery, publisher: Publisher| {
            let (output, gave_up) = (output.clone(), Arc::clone(&gave_up));
            async move {
                let send = publisher.to(&output).send_bytes("x");
                if gave_up.lock().unwrap().is_none() {
                    // 1 ms: the producer lingers 5 ms before it sends, so no report is
                    // back yet. The handler acks anyway.
                    let timed_out = tokio::time::timeout(Duration::from_millis(1), send)
                        .await
                        .is_err();
                    *gave_up.lock().unwrap() = Some(timed_out);
                } else {
                    send.await.expect("produced");
                }
                HandlerOutcome::ack()
            }
        }
    };
    three_committed(&f, handler).await;
    assert_eq!(
        *gave_up.lock().unwrap(),
        Some(true),
        "the first produce was given up before its report"
    );
    one_abort_then_all_committed(&f.reports, 3);
}

/// A transactional pipeline (windows of 200 ms) over a fresh input and output topic.
struct Fresh {
    kafka: Kafka,
    input: String,
    output: String,
    group: String,
    pipeline: EosPipeline,
    reports: Reports,
}

type Reports = Arc<Mutex<Vec<(WindowReport, Instant)>>>;

async fn fresh(name: &str) -> Fresh {
    let kafka = kafka().await;
    let (input, output) = (
        unique(&format!("{name}-in")),
        unique(&format!("{name}-out")),
    );
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    let pipeline =
        EosPipeline::new(&kafka, unique("tx")).commit_interval(Duration::from_millis(200));
    let reports = collect(&pipeline);
    Fresh {
        kafka,
        input,
        output,
        group: unique("g"),
        pipeline,
        reports,
    }
}

/// Runs `handler` over `f`'s input until 3 records produced to it are committed.
async fn three_committed<H, Args>(f: &Fresh, handler: H)
where
    H: ruststream::Handler<Args>,
    Args: 'static,
{
    let app = start(App::new().register(on(
        transactional(&f.kafka, &f.input, &f.group, &f.pipeline),
        handler,
    )))
    .await;
    produce_numbered(&f.kafka, &f.input, 3).await;
    committed_becomes(&f.group, &f.input, 0, 3, Duration::from_secs(60)).await;
    app.stop().await;
}

/// The window holding the first record (and its bad produce) aborted, no window
/// committed an input before it, and the records read again committed later, up to
/// offset `end`.
fn one_abort_then_all_committed(reports: &Reports, end: i64) {
    let reports = reports.lock().unwrap().clone();
    let first_abort = reports
        .iter()
        .position(|(r, _)| !r.committed)
        .expect("the window holding the first record aborted");
    assert!(
        reports[..first_abort]
            .iter()
            .all(|(r, _)| r.offsets.is_empty()),
        "no window committed an input before the abort: {reports:?}"
    );
    assert!(
        reports[first_abort + 1..]
            .iter()
            .any(|(r, _)| r.committed && r.offsets.iter().any(|(_, _, o)| *o == end)),
        "the records read again committed in a later window: {reports:?}"
    );
}

/// K6 with a batch handler: each batch's outputs (published with `send_all` through the
/// registration's publisher) and its inputs' offsets join the open window and commit
/// with it, at `commit_interval`: every committed window's offsets cover exactly the
/// inputs whose outputs it carried. (That a `read_committed` consumer sees each output
/// once cannot be observed on tansu, as above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_batchs_outputs_and_offsets_commit_together() {
    let kafka = kafka().await;
    let (input, output, group) = (unique("eos-bin"), unique("eos-bout"), unique("g"));
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    let pipeline =
        EosPipeline::new(&kafka, unique("tx")).commit_interval(Duration::from_millis(100));
    let reports = collect(&pipeline);
    let target = output.clone();
    let transform_all = move |batch: ruststream::batch::Batch<u32>, publisher: Publisher| {
        let target = target.clone();
        async move {
            let outputs = batch
                .values()
                .map(|n| ruststream::core::Outgoing::new(target.as_str(), format!("out-{n}")));
            if publisher.send_all(outputs).await.iter().any(Result::is_err) {
                return ruststream::BatchOutcome::retry_all();
            }
            ruststream::BatchOutcome::ack_all()
        }
    };
    let app = start(
        App::new().register(
            ruststream::on_batch(
                transactional(&kafka, &input, &group, &pipeline),
                transform_all,
            )
            .max_batch(10)
            .max_wait(Duration::from_millis(50)),
        ),
    )
    .await;
    produce_numbered(&kafka, &input, 30).await;
    committed_becomes(&group, &input, 0, 30, Duration::from_secs(60)).await;
    app.stop().await;
    let reports = reports.lock().unwrap().clone();
    let mut inputs_covered = 0i64;
    for (window, _) in reports.iter().filter(|(r, _)| r.committed) {
        match window.offsets.first() {
            Some((_, _, next)) => {
                assert_eq!(
                    *next - inputs_covered,
                    window.records as i64,
                    "window {}: offsets and outputs differ: {reports:?}",
                    window.number
                );
                inputs_covered = *next;
            }
            None => assert_eq!(window.records, 0, "outputs committed without their offsets"),
        }
    }
    assert_eq!(inputs_covered, 30);
    let outputs = read_topic(&output, 1, 30, Duration::from_secs(10)).await;
    let mut seen: Vec<String> = outputs
        .iter()
        .map(|r| String::from_utf8_lossy(&r.payload).into_owned())
        .collect();
    seen.sort();
    seen.dedup();
    let mut expected: Vec<String> = (0..30).map(|i| format!("out-{i}")).collect();
    expected.sort();
    assert_eq!(seen, expected);
}
