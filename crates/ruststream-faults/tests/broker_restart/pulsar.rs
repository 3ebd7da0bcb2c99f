//! Pulsar: two restarts of a pulsar-lite of the test's own, a broker frozen under a
//! publisher (G3), and a restart during a retry-after wait (P1).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::core::Publish;
use ruststream::{Headers, Outgoing};
use ruststream_faults::{HOLD, Service, assert_waited, free_port, installed, unique};
use ruststream_pulsar::Pulsar;

use crate::support::{Broker, Process, SERVICE, Send, data_dir, path, two_restarts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulsar_two_broker_restarts_lose_no_confirmed_message() {
    let (broker, data, address, pulsar) = own_pulsar().await;
    let topic = format!("persistent://public/default/{}", unique("restart"));
    let publisher = Arc::new(pulsar.publisher());
    let send: Send = {
        let topic = topic.clone();
        Arc::new(move |id: String| {
            let (publisher, topic) = (Arc::clone(&publisher), topic.clone());
            Box::pin(async move {
                publisher
                    .publish(Outgoing::new(topic, Bytes::from(id)))
                    .await
                    .is_ok()
            })
        })
    };
    two_restarts(
        "Pulsar Shared",
        "pulsar-lite SIGKILLed and restarted",
        Broker::Process(Box::new(broker)),
        &["pulsar", &address, &topic, "worker", "ack"],
        send,
        None,
    )
    .await;
    let _ = std::fs::remove_dir_all(&data);
}

/// G3's transient refusals on Pulsar: a send to a pulsar-lite of this test's own that
/// stopped answering (SIGSTOP) fails after the client's operation timeout (30 s) as a
/// transient `Timeout`. It failed as `Rejected`, which reads as permanent, so a caller
/// (or a copy's publish) would not have tried it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g3_a_send_to_a_pulsar_broker_that_stopped_answering_fails_as_transient() {
    let (broker, data, _address, pulsar) = own_pulsar().await;
    let topic = format!("persistent://public/default/{}", unique("frozen"));
    let publisher = pulsar.publisher();
    publisher
        .send(&topic, None, &Headers::new(), b"warm".to_vec())
        .await
        .expect("stored while the broker answers");
    broker.signal("-STOP");
    let started = Instant::now();
    let sent = publisher
        .send(&topic, None, &Headers::new(), b"frozen".to_vec())
        .await;
    let took = started.elapsed();
    broker.signal("-CONT");
    let _ = std::fs::remove_dir_all(&data);
    let error = sent.expect_err("no receipt from a frozen broker");
    assert_eq!(
        error.kind(),
        ruststream::core::PublishErrorKind::Timeout,
        "{error}"
    );
    assert!(error.kind().is_transient());
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// A pulsar-lite of this test's own, and a client through the checksum relay.
async fn own_pulsar() -> (Process, PathBuf, String, Pulsar) {
    let port = free_port();
    let data = data_dir("pulsar-restart");
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.brokers/pulsar-lite.toml");
    let broker = Process::start(
        installed("pulsar-lite"),
        vec![
            "--config".into(),
            path(&config),
            "--addr".into(),
            format!("127.0.0.1:{port}"),
            "--db-path".into(),
            path(&data),
        ],
        port,
    )
    .await;
    let address = format!("127.0.0.1:{port}");
    let relay = ruststream_test_support::pulsar_relay::start(address.clone()).await;
    let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("connect through the relay");
    (broker, data, address, pulsar)
}

/// P1, P7: the broker restarts while messages wait in `retry_after(3 s)`, held in the
/// service. The broker delivers them again as soon as the service subscribes again; the
/// service holds them for the rest of their delay, so no handler sees one before its
/// delay is over, and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_a_broker_restart_during_retry_after_keeps_the_message_and_the_wait() {
    let (broker, data, address, pulsar) = own_pulsar().await;
    let topic = format!("persistent://public/default/{}", unique("held"));
    let publisher = pulsar.publisher();
    let n = 5;
    for i in 0..n {
        publisher
            .publish(Outgoing::new(topic.clone(), Bytes::from(format!("w-{i}"))))
            .await
            .expect("published");
    }
    let mut broker = Broker::Process(Box::new(broker));
    let mut service = Service::spawn(SERVICE, &["pulsar", &address, &topic, "worker", "hold"]);
    service
        .until(Duration::from_secs(30), "every message held", |t| {
            t.held.len() >= n
        })
        .await;
    broker.restart().await;
    service
        .until(Duration::from_secs(60), "every message handled", |t| {
            t.handled().len() >= n
        })
        .await;
    let tally = service.kill().await;
    broker.stop().await;
    assert_waited(&tally.held, &tally.done, HOLD);
    println!(
        "RELIABILITY|Pulsar Shared|{n} messages waiting in retry_after(3 s), pulsar-lite SIGKILLed and restarted|lost 0 of {n}; none handled before its delay|at least {} handled twice|none declared",
        tally.done.len() - tally.handled().len()
    );
    let _ = std::fs::remove_dir_all(&data);
}
