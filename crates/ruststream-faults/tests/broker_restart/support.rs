//! What every broker's restart test shares: a broker process started again on its port and
//! data directory, the restartable broker, the publishers' flow with two restarts, and the
//! whole run against the service.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ruststream_faults::{Report, Service, settle, soak, unique};
use ruststream_kafka::rdkafka::mocking::MockCluster;
use ruststream_test_support::rabbit_broker::OwnRabbit;
use tokio::process::{Child, Command};

pub(crate) const SERVICE: &str = env!("CARGO_BIN_EXE_fault-service");
pub(crate) const PUBLISHERS: usize = 4;

pub(crate) async fn wait_listening(port: u16, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "{name} did not come up on {port}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A broker process started again on the same port and data directory.
pub(crate) struct Process {
    program: PathBuf,
    args: Vec<String>,
    port: u16,
    child: Option<Child>,
}

impl Process {
    pub(crate) async fn start(program: PathBuf, args: Vec<String>, port: u16) -> Self {
        let mut process = Self {
            program,
            args,
            port,
            child: None,
        };
        process.up().await;
        process
    }

    pub(crate) async fn up(&mut self) {
        let child = Command::new(&self.program)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.program.display()));
        self.child = Some(child);
        wait_listening(self.port, &self.program.display().to_string()).await;
    }

    /// Stops the broker answering (SIGSTOP) or lets it go on (SIGCONT): connections stay
    /// open, nothing on them is read.
    pub(crate) fn signal(&self, which: &str) {
        let pid = self
            .child
            .as_ref()
            .and_then(Child::id)
            .expect("the broker runs");
        let status = std::process::Command::new("kill")
            .args([which, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {which} {pid}");
    }

    pub(crate) async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().await.expect("SIGKILL the broker");
        }
    }
}

/// What the test restarts.
pub(crate) enum Broker {
    Process(Box<Process>),
    Rabbit(OwnRabbit),
    Mock(MockCluster<'static, ruststream_kafka::rdkafka::producer::DefaultProducerContext>),
}

impl Broker {
    pub(crate) async fn restart(&mut self) {
        match self {
            Self::Process(p) => {
                p.kill().await;
                tokio::time::sleep(Duration::from_millis(300)).await;
                p.up().await;
            }
            Self::Rabbit(broker) => {
                broker.kill();
                tokio::time::sleep(Duration::from_millis(300)).await;
                broker.start().await;
            }
            Self::Mock(cluster) => {
                cluster.broker_down(1).expect("broker down");
                tokio::time::sleep(Duration::from_secs(1)).await;
                cluster.broker_up(1).expect("broker up");
            }
        }
    }

    pub(crate) async fn stop(&mut self) {
        match self {
            Self::Process(p) => p.kill().await,
            Self::Rabbit(broker) => broker.kill(),
            Self::Mock(_) => {}
        }
    }
}

pub(crate) type Send =
    Arc<dyn Fn(String) -> ruststream::core::BoxFuture<'static, bool> + Sync + std::marker::Send>;

/// Sends messages, publisher by publisher, each until the broker confirms it; restarts
/// the broker at a third and two thirds of them; returns the confirmed payloads.
pub(crate) async fn flow(broker: &mut Broker, send: Send, messages: usize) -> BTreeSet<String> {
    let confirmed: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let mut publishers = Vec::new();
    for p in 0..PUBLISHERS {
        let (send, confirmed) = (Arc::clone(&send), Arc::clone(&confirmed));
        publishers.push(tokio::spawn(async move {
            for i in 0..messages / PUBLISHERS {
                let id = format!("{p}-{i}");
                let deadline = Instant::now() + Duration::from_secs(120);
                while !send(id.clone()).await {
                    assert!(Instant::now() < deadline, "publishing {id} never succeeded");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                confirmed
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(id);
            }
        }));
    }
    for restart in 1..=2 {
        let target = restart * messages / 3;
        let deadline = Instant::now() + Duration::from_secs(180);
        while confirmed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
            < target
        {
            assert!(
                Instant::now() < deadline,
                "publishing stalled before restart {restart}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        broker.restart().await;
    }
    for publisher in publishers {
        publisher.await.expect("publisher finished");
    }
    let confirmed = confirmed
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    assert_eq!(confirmed.len(), messages);
    confirmed
}

/// Runs the whole test: the service, the flow, two restarts, the count.
/// Where the spec documents a loss window, why (the loss is measured, not asserted).
pub(crate) type Lossy = Option<&'static str>;

pub(crate) async fn two_restarts(
    label: &str,
    how: &str,
    mut broker: Broker,
    service: &[&str],
    send: Send,
    lossy: Lossy,
) {
    let messages = 10_000 * soak();
    let mut service = Service::spawn(SERVICE, service);
    service
        .until(Duration::from_secs(30), "ready", |t| t.ready)
        .await;
    let published = flow(&mut broker, send.clone(), messages).await;
    if lossy.is_some() {
        // A last message, read behind anything still to come.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !send("end".to_owned()).await {
            assert!(
                Instant::now() < deadline,
                "publishing `end` never succeeded"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        service
            .until(Duration::from_secs(120), "`end` handled", |t| {
                t.handled().contains("end")
            })
            .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    } else {
        settle(&mut service, &published, &[], Duration::from_secs(180)).await;
    }
    let report = Report {
        published,
        lives: vec![service.kill().await],
    };
    broker.stop().await;
    report.print(
        label,
        &format!("{messages} messages from {PUBLISHERS} publishers, {how} twice"),
        lossy.unwrap_or_default(),
    );
    if lossy.is_none() {
        assert_eq!(report.lost(), 0, "confirmed messages were never handled");
    }
}

pub(crate) fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique(name));
    std::fs::create_dir_all(&dir).expect("data directory");
    dir
}

pub(crate) fn path(p: &Path) -> String {
    p.display().to_string()
}
