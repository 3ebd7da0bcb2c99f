//! `check --connect` on Core NATS (`Descriptor::verify`) against a nats-server of the
//! test's own: a server that stopped answering is seen, where a flush of the client's
//! connection still succeeds.

mod common;

use std::time::{Duration, Instant};

use common::{own_server, signal};
use ruststream_core::Descriptor;
use ruststream_nats::Nats;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_sees_a_core_server_that_stopped_answering() {
    let server = own_server::<&str>(&[]).await;
    let nats = Nats::connect(&format!("nats://{}", server.address))
        .await
        .expect("connects");
    let subject = nats.subject("check.me");
    subject.verify().await.expect("the server answers");
    signal(server.pid(), "-STOP");
    // What the check asked before: a flush, which only writes to the socket.
    let flushed = tokio::time::timeout(Duration::from_secs(2), nats.client().flush()).await;
    let started = Instant::now();
    let verified = subject.verify().await;
    let took = started.elapsed();
    signal(server.pid(), "-CONT");
    assert!(matches!(flushed, Ok(Ok(()))), "{flushed:?}");
    let err = verified.expect_err("a frozen server does not answer");
    assert!(err.contains("did not answer"), "{err}");
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
    subject.verify().await.expect("the server answers again");
}
