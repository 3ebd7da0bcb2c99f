//! Restart nats-server twice while 10,000 messages flow from several publishers into a
//! JetStream stream: the service reconnects by itself, and every message whose publish
//! the server acknowledged is handled.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::{App, Delivery, HandlerOutcome, Headers, on};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
use tokio::process::{Child, Command};

const MESSAGES: usize = 10_000;
const PUBLISHERS: usize = 4;

/// The nats-server binary scripts/test installed.
fn server_binary() -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = root.join(".brokers/bin/nats-server");
    assert!(
        binary.exists(),
        "{} is missing: run the tests with scripts/test, which installs it",
        binary.display()
    );
    binary
}

fn start_server(port: u16, data: &std::path::Path) -> Child {
    Command::new(server_binary())
        .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server starts")
}

async fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "nats-server did not come up on {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_broker_restarts_lose_no_acknowledged_message() {
    // A server of this test's own, so restarting it disturbs no other test.
    let port = 20_000 + (std::process::id() % 20_000) as u16;
    let data = std::env::temp_dir().join(format!("ruststream-restart-{}", std::process::id()));
    let mut server = start_server(port, &data);
    wait_listening(port).await;
    let url = format!("nats://127.0.0.1:{port}");
    let nats = Nats::connect(&url).await.expect("connect");
    jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: "RESTART".into(),
            subjects: vec!["restart.>".into()],
            ..Default::default()
        })
        .await
        .expect("stream");

    let handled: Arc<Mutex<HashSet<String>>> = Arc::default();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handler = {
        let (handled, calls) = (Arc::clone(&handled), Arc::clone(&calls));
        move |d: Delivery| {
            let (handled, calls) = (Arc::clone(&handled), Arc::clone(&calls));
            async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                handled
                    .lock()
                    .unwrap()
                    .insert(String::from_utf8_lossy(d.payload()).into_owned());
                HandlerOutcome::ack()
            }
        }
    };
    let running = App::new()
        .register(
            on(
                nats.consumer("RESTART", "worker")
                    .filter_subject("restart.>"),
                handler,
            )
            .lanes(4),
        )
        .start()
        .await
        .expect("start");

    // Publishers retry until the server acknowledges; only acknowledged ids count.
    let acknowledged: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let (publisher, acknowledged) = (nats.publisher(), Arc::clone(&acknowledged));
        publishers.push(tokio::spawn(async move {
            for i in 0..MESSAGES / PUBLISHERS {
                let id = format!("{p}-{i}");
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let sent = publisher
                        .jetstream(
                            &format!("restart.{p}"),
                            &Headers::new(),
                            id.clone().into(),
                            Some(&id),
                        )
                        .await;
                    if sent.is_ok() {
                        acknowledged.lock().unwrap().insert(id);
                        break;
                    }
                    assert!(Instant::now() < deadline, "publishing {id} never succeeded");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }

    // Restart the server twice while messages flow.
    for restart in 1..=2 {
        let target = restart * MESSAGES / 3;
        let deadline = Instant::now() + Duration::from_secs(120);
        while acknowledged.lock().unwrap().len() < target {
            assert!(
                Instant::now() < deadline,
                "publishing stalled before restart {restart}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server.kill().await.expect("stop the server");
        tokio::time::sleep(Duration::from_millis(300)).await;
        server = start_server(port, &data);
        wait_listening(port).await;
    }
    for publisher in publishers {
        publisher.await.expect("publisher finished");
    }
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert_eq!(acknowledged.len(), MESSAGES);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let missing = acknowledged.difference(&handled.lock().unwrap()).count();
        if missing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} acknowledged messages were never handled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await;
    let calls = calls.load(std::sync::atomic::Ordering::SeqCst);
    // A line scripts/reliability collects into RELIABILITY.md.
    println!(
        "RELIABILITY|NATS JetStream|{MESSAGES} messages from {PUBLISHERS} publishers, nats-server SIGKILLed and restarted twice|lost 0 of {MESSAGES} acknowledged|{} handled twice|0 dead-lettered",
        calls - MESSAGES
    );
    server.kill().await.expect("stop the server");
    let _ = std::fs::remove_dir_all(&data);
}
