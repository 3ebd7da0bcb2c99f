//! Fault tests for ruststream: the services under test run as separate processes
//! (`src/bin`), so a test can kill them with SIGKILL and start them again.
//!
//! What the tests share lives here: the service as a child process whose output lines
//! are tallied as they come, the tally of several lives of a service, the
//! `RELIABILITY|…` line `scripts/reliability` collects, and the soak factor.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

mod postgres;
mod target;
pub use postgres::OwnPostgres;
pub use target::Target;

/// How many times the default counts the fault tests use: `RUSTSTREAM_SOAK` (a whole
/// number, default 1). `RUSTSTREAM_SOAK=20 scripts/reliability` is the heavier soak run.
pub fn soak() -> usize {
    match std::env::var("RUSTSTREAM_SOAK") {
        Ok(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or_else(|| panic!("RUSTSTREAM_SOAK must be a whole number above 0, not `{v}`")),
        Err(_) => 1,
    }
}

/// The services' log: to stderr (stdout carries their lines for the test), filtered by
/// `RUST_LOG` (default `info`). A subscription that lost its connection and subscribed
/// again (Pulsar) also prints `reconnected - 0` to stdout, for the test's tally.
pub fn log_to_stderr() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::new(
        std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
    );
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .with(
            Reconnects.with_filter(tracing_subscriber::filter::filter_fn(|m| {
                m.target().ends_with("::subscription") && *m.level() <= tracing::Level::INFO
            })),
        )
        .init();
}

/// Prints `reconnected - 0` when a subscription says it subscribed again.
struct Reconnects;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Reconnects {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" && format!("{value:?}") == "subscribed again" {
                    self.0 = true;
                }
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            println!("reconnected - 0");
        }
    }
}

/// How long `fault-service`'s `hold` mode asks the first attempt to wait.
pub const HOLD: Duration = Duration::from_secs(3);

/// Asserts that every message in `held` was acked (in `done`) no earlier than `wait`
/// after it was held. Both times are when the test read the lines, so 100 ms of reading
/// latency are allowed for.
pub fn assert_waited(held: &[Line], done: &[Line], wait: Duration) {
    for held in held {
        let acked = done
            .iter()
            .find(|d| d.payload == held.payload)
            .unwrap_or_else(|| panic!("{} was never handled after its wait", held.payload));
        let after = acked.at.duration_since(held.at);
        assert!(
            after + Duration::from_millis(100) >= wait,
            "{} was handled again {after:?} after asking for retry_after({wait:?})",
            held.payload
        );
    }
}

/// A broker binary the test command installed in `.brokers/bin` (a missing one fails
/// the test, naming it).
pub fn installed(name: &str) -> std::path::PathBuf {
    let binary = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.brokers/bin")
        .join(name);
    assert!(
        binary.exists(),
        "{} is missing: run the tests with scripts/test, which installs it",
        binary.display()
    );
    binary
}

/// A port nothing listens on now, for a broker of a test's own (see
/// [`ruststream_test_support::free_port`]).
pub fn free_port() -> u16 {
    ruststream_test_support::free_port()
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", ruststream_test_support::unique_suffix())
}

/// One handler-call line of the service.
#[derive(Debug, Clone)]
pub struct Line {
    /// The payload.
    pub payload: String,
    /// The attempt number.
    pub attempt: u32,
    /// When the test read it.
    pub at: Instant,
}

/// What a service printed: `start`, `done` and `held` lines.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// It printed `ready`.
    pub ready: bool,
    /// Handler calls begun.
    pub started: Vec<Line>,
    /// Handler calls that acked.
    pub done: Vec<Line>,
    /// Handler calls that asked for `retry_after`.
    pub held: Vec<Line>,
    /// The most duplicates an inbox said it skipped (`skipped <count>` lines).
    pub skipped: u64,
    /// How often a subscription lost its connection and subscribed again
    /// (`reconnected` lines).
    pub reconnected: usize,
}

impl Tally {
    fn take(&mut self, line: &str) {
        let mut words = line.split(' ');
        let event = words.next().unwrap_or_default();
        if event == "ready" {
            self.ready = true;
            return;
        }
        let (Some(payload), Some(attempt)) = (words.next(), words.next()) else {
            return;
        };
        if event == "reconnected" {
            self.reconnected += 1;
            return;
        }
        if event == "skipped" {
            self.skipped = self.skipped.max(payload.parse().unwrap_or(0));
            return;
        }
        let entry = Line {
            payload: payload.to_owned(),
            attempt: attempt.parse().unwrap_or(0),
            at: Instant::now(),
        };
        match event {
            "start" => self.started.push(entry),
            "done" => self.done.push(entry),
            "held" => self.held.push(entry),
            _ => {}
        }
    }

    /// The payloads acked at least once.
    pub fn handled(&self) -> BTreeSet<String> {
        self.done.iter().map(|l| l.payload.clone()).collect()
    }
}

/// One life of the service under test.
pub struct Service {
    child: Child,
    tally: Arc<Mutex<Tally>>,
    /// Reads stdout until the child's end of it.
    reader: tokio::task::JoinHandle<()>,
}

impl Service {
    /// Starts `program` with `args`; its stdout lines are tallied as they come, its
    /// stderr goes to the test's.
    pub fn spawn(program: &str, args: &[&str]) -> Self {
        Self::spawn_with(program, args, &[])
    }

    /// Like [`Service::spawn`], with environment variables set.
    pub fn spawn_with(program: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        let mut lines = BufReader::new(child.stdout.take().expect("stdout piped")).lines();
        let tally = Arc::new(Mutex::new(Tally::default()));
        let sink = Arc::clone(&tally);
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                sink.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take(&line);
            }
        });
        Self {
            child,
            tally,
            reader,
        }
    }

    /// What it printed so far.
    pub fn tally(&self) -> Tally {
        self.tally
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `done` holds of its tally; fails the test after `limit`.
    pub async fn until(&mut self, limit: Duration, what: &str, done: impl Fn(&Tally) -> bool) {
        let deadline = Instant::now() + limit;
        loop {
            if done(&self.tally()) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the service exited ({status}) before: {what}");
            }
            assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends it a signal by name (`TERM`, `INT`) with the system's `kill`.
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().expect("the service runs");
        let status = std::process::Command::new("kill")
            .args([format!("-{name}"), pid.to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{name} {pid} failed");
    }

    /// Waits at most `limit` for it to exit; its exit code (`None` when killed by a
    /// signal), or a failed test when it is still running.
    pub async fn exits_within(&mut self, limit: Duration) -> Option<i32> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the service still runs {limit:?} later"))
            .expect("waiting for the service");
        status.code()
    }

    /// [`exits_within`](Self::exits_within), then everything it printed (read to the end
    /// of its output).
    pub async fn exited_within(mut self, limit: Duration) -> (Option<i32>, Tally) {
        let code = self.exits_within(limit).await;
        tokio::time::timeout(Duration::from_secs(10), &mut self.reader)
            .await
            .expect("the ended service's output ends")
            .expect("the output reader finished");
        (code, self.tally())
    }

    /// SIGKILL; returns everything it printed (read to the end of its output).
    pub async fn kill(mut self) -> Tally {
        self.child.kill().await.expect("SIGKILL the service");
        tokio::time::timeout(Duration::from_secs(10), &mut self.reader)
            .await
            .expect("the killed service's output ends")
            .expect("the output reader finished");
        self.tally()
    }
}

/// What several lives of a service did with `published` messages, as the
/// `RELIABILITY|transport|what was tried|lost|duplicated|dead-lettered` line
/// `scripts/reliability` collects into RELIABILITY.md.
pub struct Report {
    /// The messages the broker confirmed.
    pub published: BTreeSet<String>,
    /// Every life's tally.
    pub lives: Vec<Tally>,
}

impl Report {
    /// The published messages no life acked.
    pub fn lost(&self) -> usize {
        let handled: BTreeSet<String> = self.lives.iter().flat_map(Tally::handled).collect();
        self.published.difference(&handled).count()
    }

    /// Acks beyond the first for the same message.
    pub fn duplicated(&self) -> usize {
        let acks: usize = self.lives.iter().map(|t| t.done.len()).sum();
        let handled: BTreeSet<String> = self.lives.iter().flat_map(Tally::handled).collect();
        acks - handled.len()
    }

    /// Prints the line; `why_lost` explains a loss the spec documents.
    pub fn print(&self, transport: &str, tried: &str, why_lost: &str) {
        let lost = self.lost();
        let why = if lost > 0 && !why_lost.is_empty() {
            format!(" ({why_lost})")
        } else {
            String::new()
        };
        println!(
            "RELIABILITY|{transport}|{tried}|lost {lost} of {}{why}|at least {} handled twice|none declared",
            self.published.len(),
            self.duplicated()
        );
    }
}

/// Waits until every one of `published` is acked by `service` or an earlier life, or
/// `limit` passed (the caller's assertion on [`Report::lost`] then names the loss).
pub async fn settle(
    service: &mut Service,
    published: &BTreeSet<String>,
    earlier: &[Tally],
    limit: Duration,
) {
    let deadline = Instant::now() + limit;
    let before: BTreeSet<String> = earlier.iter().flat_map(Tally::handled).collect();
    while Instant::now() < deadline {
        if let Ok(Some(status)) = service.child.try_wait() {
            panic!("the service exited ({status}) before handling everything");
        }
        let handled: BTreeSet<String> = before.union(&service.tally().handled()).cloned().collect();
        if published.is_subset(&handled) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kafka helpers (the tests reach tansu at `RUSTSTREAM_KAFKA_BROKERS`).
pub mod kafka {
    use std::time::Duration;

    use ruststream_kafka::rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use ruststream_kafka::rdkafka::client::DefaultClientContext;
    use ruststream_kafka::rdkafka::config::ClientConfig;

    /// The brokers scripts/test started; a missing variable fails the test.
    pub fn brokers() -> String {
        std::env::var("RUSTSTREAM_KAFKA_BROKERS").expect(
            "RUSTSTREAM_KAFKA_BROKERS is not set: run the tests with scripts/test, which starts tansu",
        )
    }

    /// Creates single-partition topics on `brokers`.
    pub async fn create_topics(brokers: &str, topics: &[&str]) {
        create_partitioned(brokers, topics, 1).await;
    }

    /// Creates topics of `partitions` partitions each on `brokers`.
    pub async fn create_partitioned(brokers: &str, topics: &[&str], partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("admin client");
        for r in admin
            .create_topics(
                &topics
                    .iter()
                    .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
                    .collect::<Vec<_>>(),
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
            )
            .await
            .expect("the Kafka broker answers")
        {
            r.expect("topic created");
        }
        // Dropping an rdkafka client can block its thread (see brokers.md); let it be.
        std::mem::forget(admin);
    }
}
