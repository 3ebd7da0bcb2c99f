//! G3: dead letters and retry copies the server refuses (a full stream, over
//! `max_payload`, no stream at all): tried again, dead-lettered, or reported as lost.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{Script, create_stream, eventually, handler, logs, nats, unique};
use bytes::Bytes;
use futures_util::StreamExt;
use ruststream::{App, HandlerOutcome, Headers, on};
use ruststream_nats::async_nats::jetstream::{self, stream};
use ruststream_test_support::{cpu_share_over, reliability};

/// A stream that holds one message and refuses the next (discard new): a dead-letter
/// destination the broker refuses for good.
async fn full_stream(nats: &ruststream_nats::Nats, name: &str, subject: &str) -> stream::Stream {
    let stream = jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: vec![subject.to_owned()],
            max_messages: 1,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await
        .expect("create the small stream");
    nats.publisher()
        .jetstream(
            subject,
            &Headers::new(),
            Bytes::from_static(b"filler"),
            None,
        )
        .await
        .expect("fill the small stream");
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_jetstream_dead_letter_refused_by_a_full_stream_is_tried_again_never_the_handler() {
    let nats = nats().await;
    let base = unique("G3FULL");
    let subject = format!("{base}.in");
    let dead = format!("{base}.dead");
    let stream = create_stream(&nats, &base, std::slice::from_ref(&subject)).await;
    let mut dead_stream = full_stream(&nats, &format!("{base}_DEAD"), &dead).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .metrics()
        .register(
            on(
                nats.consumer(&base, "worker").filter_subject(&subject),
                handler(Arc::clone(&script)),
            )
            .max_attempts(2)
            .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    for payload in [b"one" as &[u8], b"two"] {
        nats.publisher()
            .jetstream(
                &subject,
                &Headers::new(),
                Bytes::copy_from_slice(payload),
                None,
            )
            .await
            .expect("publish");
    }
    eventually(Duration::from_secs(10), "both at the cap", || {
        script.calls().iter().filter(|c| c.attempt == 2).count() == 2
    })
    .await;
    let window = Duration::from_secs(15);
    let (before, cpu) = (script.count(), cpu_share_over(window).await);
    let runs = script.count() - before;
    // Issue #46, item 6: the originals come back (attempts 3, 4, ...) and only their
    // dead letters are tried again; the handler, capped at 2, never sees attempt 3.
    assert_eq!(runs, 0, "{runs} handler runs past the cap in {window:?}");
    assert!(
        script.calls().iter().all(|c| c.attempt <= 2),
        "attempts the handler saw: {:?}",
        script.calls().iter().map(|c| c.attempt).collect::<Vec<_>>()
    );
    assert!(
        logs().contains("the handler is not run again"),
        "the originals came back and their dead letters were tried again"
    );
    let info = stream.consumer_info("worker").await.expect("consumer info");
    assert_eq!(
        info.num_ack_pending as u64 + info.num_pending,
        2,
        "both originals still held by the stream, none terminated"
    );
    // The "copies refused" alert of docs/operating.md fires.
    let refused = ruststream_test_support::ops::metric(
        &app,
        "ruststream_copy_failures_total",
        &["kind=\"refused\""],
    )
    .await;
    assert!(refused >= 2.0, "copies refused counted: {refused}");
    assert!(
        logs().contains("destination full"),
        "the refusal names its cause"
    );
    // The destination has room again: both dead letters land, the originals terminate.
    let mut config = dead_stream.info().await.expect("info").config.clone();
    config.max_messages = -1;
    jetstream::new(nats.client().clone())
        .update_stream(config)
        .await
        .expect("make room");
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    loop {
        let stored = dead_stream.info().await.expect("info").state.messages;
        let info = stream.consumer_info("worker").await.expect("consumer info");
        if stored == 3 && info.num_ack_pending == 0 && info.num_pending == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stored {stored} of 3 (the filler and 2 dead letters), pending {} + {}",
            info.num_ack_pending,
            info.num_pending
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    app.stop().await;
    reliability(
        "NATS JetStream",
        &format!(
            "refused dead letter: 2 messages at max_attempts(2), dead-letter stream full (max_msgs=1, discard new), then given room; {runs} handler runs in {}s of refusal, CPU {:.1}% of a core",
            window.as_secs(),
            cpu * 100.0
        ),
        "lost 0 of 2",
        "the originals come back with backoff (1 s, 2 s, 4 s...) while refused",
        "2 dead-lettered once the stream had room",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_core_retry_copy_over_max_payload_goes_to_the_dead_letter() {
    let nats = nats().await;
    let subject = unique("g3big");
    let dead = format!("{subject}.dead");
    let mut dead_letters = nats.client().subscribe(dead.clone()).await.unwrap();
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .register(
            on(nats.subject(&subject), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    // Fits, but not with the retry-count header added.
    let max = nats.client().server_info().max_payload;
    let payload = Bytes::from(vec![7u8; max - 16]);
    nats.client()
        .publish(subject.clone(), payload.clone())
        .await
        .unwrap();
    let letter = tokio::time::timeout(Duration::from_secs(10), dead_letters.next())
        .await
        .expect("a dead letter")
        .unwrap();
    assert_eq!(letter.payload, payload, "the message as it arrived");
    assert!(
        letter.headers.is_none_or(|h| h.is_empty()),
        "no header added"
    );
    assert_eq!(script.count(), 1, "no copy could carry a second attempt");
    let log = logs();
    assert!(log.contains("too large"), "the cause is named");
    assert!(!log.contains(&format!("{subject}` failed (disconnected)")));
    app.stop().await;
    reliability(
        "NATS Core",
        "near-limit message: payload max_payload - 16 bytes, retry() under max_attempts(3), its retry copy over max_payload",
        "lost 0 of 1",
        "0 handled twice",
        "1 dead-lettered (the message as it arrived, since no copy fits)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_core_refused_dead_letter_is_an_error_that_says_lost() {
    let nats = nats().await;
    let base = unique("G3LOST");
    let subject = format!("{base}.in");
    let dead = format!("{base}.dead");
    full_stream(&nats, &format!("{base}_DEAD"), &dead).await;
    let script = Script::new(|_| HandlerOutcome::retry());
    let app = App::new()
        .metrics()
        .register(
            on(nats.subject(&subject), handler(Arc::clone(&script)))
                .max_attempts(2)
                .dead_letter(&dead),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    nats.client()
        .publish(subject.clone(), Bytes::from_static(b"doomed"))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the loss is logged", || {
        logs().contains("the message is lost") && logs().contains(&dead)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(script.count(), 2, "max_attempts runs, then no loop");
    let log = logs();
    let line = log
        .lines()
        .find(|l| l.contains("the message is lost") && l.contains(&dead))
        .expect("the line");
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("destination full"), "{line}");
    // The "messages lost" alert of docs/operating.md fires.
    let lost = ruststream_test_support::ops::metric(
        &app,
        "ruststream_copy_failures_total",
        &["kind=\"lost\""],
    )
    .await;
    assert_eq!(lost, 1.0, "the loss is counted");
    app.stop().await;
    reliability(
        "NATS Core",
        "refused dead letter: retry() under max_attempts(2), dead-letter subject captured by a full stream",
        "lost 1 of 1 (Core holds nothing to bring back; logged at ERROR with \"lost\", subject and reason)",
        "0 handled twice",
        "0 (refused)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_core_capped_retry_whose_copy_went_out_logs_no_warning() {
    let nats = nats().await;
    let subject = unique("g3quiet");
    let script = Script::new(|d| {
        if d.attempt().number() == 1 {
            HandlerOutcome::retry()
        } else {
            HandlerOutcome::ack()
        }
    });
    let app = App::new()
        .register(
            on(nats.subject(&subject), handler(Arc::clone(&script)))
                .max_attempts(3)
                .dead_letter(format!("{subject}.dead")),
        )
        .start()
        .await
        .expect("start");
    nats.client().flush().await.unwrap();
    nats.client()
        .publish(subject.clone(), Bytes::from_static(b"once more"))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the copy handled", || {
        script.count() == 2
    })
    .await;
    app.stop().await;
    let log = logs();
    let noisy: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(&subject) && (l.contains("WARN") || l.contains("ERROR")))
        .collect();
    assert!(noisy.is_empty(), "the designed path is quiet: {noisy:#?}");
}
