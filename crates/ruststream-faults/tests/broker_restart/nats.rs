//! NATS: two restarts of a nats-server of the test's own, under JetStream (nothing
//! confirmed lost) and Core NATS (the loss measured).

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use ruststream::Headers;
use ruststream_faults::{free_port, installed, unique};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};

use crate::support::{Broker, Process, Send, data_dir, path, two_restarts};

/// A nats-server of this test's own, with JetStream, and a client.
async fn own_nats() -> (Process, PathBuf, String, Nats) {
    let port = free_port();
    let data = data_dir("nats-restart");
    let broker = Process::start(
        installed("nats-server"),
        vec![
            "-a".into(),
            "127.0.0.1".into(),
            "-p".into(),
            port.to_string(),
            "-js".into(),
            "-sd".into(),
            path(&data),
        ],
        port,
    )
    .await;
    let url = format!("nats://127.0.0.1:{port}");
    let nats = Nats::connect(&url).await.expect("connect");
    (broker, data, url, nats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_two_server_restarts_lose_no_confirmed_message() {
    let (broker, data, url, nats) = own_nats().await;
    let subject = "RESTART";
    jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: subject.into(),
            subjects: vec![subject.into()],
            ..Default::default()
        })
        .await
        .expect("stream");
    let publisher = nats.publisher();
    let send: Send = Arc::new(move |id: String| {
        let publisher = publisher.clone();
        Box::pin(async move {
            // Nats-Msg-Id: a publish repeated after a lost acknowledgement is stored once.
            publisher
                .jetstream(subject, &Headers::new(), Bytes::from(id.clone()), Some(&id))
                .await
                .is_ok()
        })
    });
    two_restarts(
        "NATS JetStream",
        "nats-server SIGKILLed and restarted",
        Broker::Process(Box::new(broker)),
        &["jetstream", &url, subject, "worker", "ack"],
        send,
        None,
    )
    .await;
    let _ = std::fs::remove_dir_all(&data);
}

/// N2: Core NATS keeps nothing; what flows while the server is away, or while the
/// service's subscription is being re-established, is lost. Measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_core_two_server_restarts_loss_is_measured() {
    let (broker, data, url, nats) = own_nats().await;
    let subject = unique("restart");
    let publisher = nats.publisher();
    let send: Send = {
        let subject = subject.clone();
        Arc::new(move |id: String| {
            let (publisher, subject) = (publisher.clone(), subject.clone());
            // Confirmed by a flush: the server had it.
            Box::pin(async move {
                publisher
                    .core(&subject, &Headers::new(), Bytes::from(id))
                    .await
                    .is_ok()
            })
        })
    };
    two_restarts(
        "NATS Core",
        "nats-server SIGKILLed and restarted",
        Broker::Process(Box::new(broker)),
        &["core", &url, &subject, "worker", "ack"],
        send,
        Some("at-most-once by design, N2"),
    )
    .await;
    let _ = std::fs::remove_dir_all(&data);
}
