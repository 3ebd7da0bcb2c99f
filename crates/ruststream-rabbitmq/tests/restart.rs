//! A rabbitmq-server of the test's own, SIGKILLed and started again under a running app:
//! the connection recovers (lapin's auto-recovery), the consumer reads on, and no
//! message the broker confirmed is lost (a durable classic queue, persistent messages).
//!
//! Not yet on a quorum queue: there, after the same restart, lapin's channels stayed in
//! `Reconnecting` (tried 2026-12-01; the docs say so).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::{App, Delivery, HandlerOutcome, Headers, on};
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_test_support::{eventually, unique_suffix};

/// A broker process on its own ports and directories, killed on drop.
struct OwnBroker {
    /// The wrapper scripts started, reaped once killed.
    wrappers: Mutex<Vec<std::process::Child>>,
    port: u16,
    dist: u16,
    node: String,
    base: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl OwnBroker {
    fn new() -> Self {
        let suffix = unique_suffix();
        let base = std::env::temp_dir().join(format!("rabbit-restart-{suffix}"));
        Self {
            wrappers: Mutex::default(),
            port: free_port(),
            dist: free_port(),
            node: format!("rs-restart-{}@localhost", suffix.replace(['-', '.'], "")),
            base,
        }
    }

    /// Starts it (again) and waits until it takes connections.
    async fn start(&self) {
        for dir in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(self.base.join(dir)).expect("broker directories");
        }
        std::fs::write(self.base.join("enabled_plugins"), "[].").expect("plugins file");
        // Debian's wrapper switches to the rabbitmq user when run as root.
        let _ = std::process::Command::new("chown")
            .args(["-R", "rabbitmq:rabbitmq"])
            .arg(&self.base)
            .status();
        let binary = "rabbitmq-server";
        let wrapper = std::process::Command::new(binary)
            .env("HOME", self.base.join("home"))
            .env("RABBITMQ_NODENAME", &self.node)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist.to_string())
            .env("RABBITMQ_MNESIA_BASE", self.base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.base.join("log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.base.join("enabled_plugins"),
            )
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary} (the test command installs it): {e}"));
        self.wrappers.lock().unwrap().push(wrapper);
        let deadline = Instant::now() + Duration::from_secs(60);
        while tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "rabbitmq-server did not come up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILLs every process of this node (the Erlang VM and its wrapper).
    fn kill(&self) {
        let wanted = format!("RABBITMQ_NODENAME={}", self.node);
        for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if environ
                .split(|b| *b == 0)
                .any(|var| var == wanted.as_bytes())
            {
                let _ = std::process::Command::new("kill")
                    .arg("-9")
                    .arg(entry.file_name())
                    .status();
            }
        }
        for mut wrapper in self.wrappers.lock().unwrap().drain(..) {
            let _ = wrapper.kill();
            let _ = wrapper.wait();
        }
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// Publishes `payload` until the broker confirms it (the connection may be recovering).
async fn confirmed(rabbit: &RabbitMq, queue: &str, payload: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match rabbit
            .publisher()
            .send(queue, &Headers::new(), payload.as_bytes())
            .await
        {
            Ok(()) => return,
            Err(e) => {
                if Instant::now() >= deadline {
                    let logs = ruststream_test_support::logs();
                    let tail: Vec<&str> = logs.lines().rev().take(40).collect();
                    panic!(
                        "{payload} never confirmed: {e}\n{}",
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_the_connection_recovers_from_a_broker_restart_and_nothing_confirmed_is_lost() {
    ruststream_test_support::capture_logs("info,lapin=warn");
    let broker = OwnBroker::new();
    broker.start().await;
    let rabbit = RabbitMq::connect(&broker.url()).await.expect("connect");
    let queue = format!("restart-{}", unique_suffix());
    rabbit
        .declare_queue(&queue, QueueKind::Classic)
        .await
        .expect("declared");
    let handled: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let seen = Arc::clone(&handled);
    let running = App::new()
        .register(on(
            rabbit.queue(&queue).kind(QueueKind::Classic),
            move |d: Delivery| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock()
                        .unwrap()
                        .insert(String::from_utf8_lossy(d.payload()).into_owned());
                    HandlerOutcome::ack()
                }
            },
        ))
        .start()
        .await
        .expect("starts");
    let mut published = BTreeSet::new();
    for n in 0..100 {
        let payload = format!("before-{n}");
        confirmed(&rabbit, &queue, &payload).await;
        published.insert(payload);
    }
    eventually(Duration::from_secs(30), "some handled", || {
        handled.lock().unwrap().len() >= 30
    })
    .await;
    broker.kill();
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.start().await;
    for n in 0..100 {
        let payload = format!("after-{n}");
        confirmed(&rabbit, &queue, &payload).await;
        published.insert(payload);
    }
    eventually(
        Duration::from_secs(90),
        "every confirmed message handled",
        || handled.lock().unwrap().is_superset(&published),
    )
    .await;
    running.stop().await;
}
