//! `send_all` against a real nats-server: JetStream and Core subjects mixed in one call,
//! a result for each, a refused subject alone, a server that stopped answering.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{create_stream, nats, own_server, signal, unique};
use ruststream::Publisher;
use ruststream::core::{Outgoing, PublishErrorKind};
use ruststream_nats::MessageId;
use ruststream_nats::async_nats::jetstream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_mixes_stream_and_core_subjects_and_answers_each() {
    let nats = nats().await;
    let name = unique("SENDALL");
    let (stored, core) = (format!("{name}.in"), format!("{name}.core"));
    create_stream(&nats, &name, std::slice::from_ref(&stored)).await;
    let mut heard = nats.client().subscribe(core.clone()).await.expect("sub");
    nats.client().flush().await.expect("flushed");
    let messages = vec![
        Outgoing::new(stored.as_str(), "s1"),
        // Two in a row to one Core subject: the second reuses the first's client subject.
        Outgoing::new(core.as_str(), "c1"),
        Outgoing::new(core.as_str(), "c2"),
        Outgoing::new(format!("{name}.bad subject"), "refused"),
        Outgoing::new(stored.as_str(), "s2"),
        // The stream keeps one message per id: the second is confirmed, not stored.
        {
            let mut m = Outgoing::new(stored.as_str(), "s3");
            m.extras.insert(MessageId("once".into()));
            m
        },
        {
            let mut m = Outgoing::new(stored.as_str(), "s3 again");
            m.extras.insert(MessageId("once".into()));
            m
        },
    ];
    let results = Publisher::new(nats.publish_handle())
        .send_all(messages)
        .await;
    assert_eq!(results.len(), 7);
    for (i, result) in results.iter().enumerate() {
        if i == 3 {
            let e = result
                .as_ref()
                .expect_err("a subject with a space is refused");
            assert!(e.to_string().contains("bad subject"), "{e}");
            assert!(!e.kind().is_transient(), "{:?}", e.kind());
            assert_ne!(e.kind(), PublishErrorKind::Disconnected);
        } else {
            assert!(result.is_ok(), "message {i}: {result:?}");
        }
    }
    let stream = jetstream::new(nats.client().clone())
        .get_stream(&name)
        .await
        .expect("stream");
    let mut payloads = Vec::new();
    for sequence in 1..=stream.cached_info().state.messages {
        let message = stream.get_raw_message(sequence).await.expect("stored");
        payloads.push(message.payload);
    }
    assert_eq!(payloads, [Bytes::from("s1"), "s2".into(), "s3".into()]);
    hears_in_order(&mut heard, &["c1", "c2"]).await;
    let more = tokio::time::timeout(Duration::from_millis(300), heard.next()).await;
    assert!(more.is_err(), "nothing else on the Core subject: {more:?}");
}

use futures_util::StreamExt as _;

/// The Core subscription hears exactly these payloads next, in order.
async fn hears_in_order(heard: &mut ruststream_nats::async_nats::Subscriber, expected: &[&str]) {
    for expected in expected {
        let message = tokio::time::timeout(Duration::from_secs(5), heard.next())
            .await
            .expect("heard in time")
            .expect("subscription open");
        assert_eq!(message.payload, *expected);
    }
}

/// A JetStream server that stopped answering (SIGSTOP, on a server of the test's own):
/// each message waits for its acknowledgement at most 5 s from its own send, so 3,000
/// messages (three windows of 1,000 in flight) fail with `Timeout` in about 15 s. The
/// client's own timeout counts from the await: awaited one after another, each of the
/// last 1,000 would have waited 5 s more (hours for the call).
/// A Core message the client refuses (larger than the server's `max_payload`) fails
/// alone, with or without headers; the messages around it go out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_refuses_an_oversized_core_message_alone() {
    let nats = nats().await;
    let core = format!("{}.core", unique("SENDALL_BIG"));
    let mut heard = nats.client().subscribe(core.clone()).await.expect("sub");
    nats.client().flush().await.expect("flushed");
    let too_large = vec![b'x'; nats.client().server_info().max_payload + 1];
    let mut with_headers = Outgoing::new(core.as_str(), too_large.clone());
    with_headers.headers.insert("kind", "big");
    let messages = vec![
        Outgoing::new(core.as_str(), "before"),
        Outgoing::new(core.as_str(), too_large),
        with_headers,
        Outgoing::new(core.as_str(), "after"),
    ];
    let results = Publisher::new(nats.publish_handle())
        .send_all(messages)
        .await;
    for refused in &results[1..3] {
        let e = refused.as_ref().expect_err("too large");
        assert_eq!(e.kind(), PublishErrorKind::TooLarge, "{e}");
        assert!(e.to_string().contains(&core), "{e}");
    }
    assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
    hears_in_order(&mut heard, &["before", "after"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_all_to_a_server_that_stopped_answering_bounds_each_ack_from_its_send() {
    let store = std::env::temp_dir().join(unique("nats-frozen"));
    let server = own_server(&["-js", "-sd", store.to_str().expect("a UTF-8 path")]).await;
    let nats = ruststream_nats::Nats::connect(&format!("nats://{}", server.address))
        .await
        .expect("connects");
    let name = unique("FROZEN");
    create_stream(&nats, &name, std::slice::from_ref(&name)).await;
    let publisher = Publisher::new(nats.publish_handle());
    let to: Arc<str> = Arc::from(name.as_str());
    // Also learns that a stream captures the subject (kept 5 s): the call asks nothing.
    publisher
        .publish(Outgoing::new(Arc::clone(&to), "warm"))
        .await
        .expect("stored while the server answers");
    signal(server.pid(), "-STOP");
    let started = Instant::now();
    let results = publisher
        .send_all((0..3_000).map(|n| Outgoing::new(Arc::clone(&to), n.to_string())))
        .await;
    let took = started.elapsed();
    signal(server.pid(), "-CONT");
    let _ = std::fs::remove_dir_all(&store);
    assert_eq!(results.len(), 3_000);
    for (i, result) in results.iter().enumerate() {
        let error = result
            .as_ref()
            .expect_err("nothing acknowledged while frozen");
        assert_eq!(
            error.kind(),
            PublishErrorKind::Timeout,
            "message {i}: {error}"
        );
        assert_eq!(error.address(), name, "message {i}");
    }
    assert!(took < Duration::from_secs(40), "the call took {took:?}");
}
