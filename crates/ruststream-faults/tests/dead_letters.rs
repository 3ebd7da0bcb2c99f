//! Operating dead letters from the service's own command line, against the real brokers:
//! 20 messages a broken handler gives up on are dead letters that say why; once the
//! handler is fixed, `dead-letters replay` brings every one back and it is handled; a
//! replay SIGKILLed midway and run again loses none; the dead-letter address is empty
//! afterwards; a letter replayed three times already is refused.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::Outgoing;
use ruststream::core::{DEAD_LETTER_SOURCE, REPLAYS_HEADER};
use ruststream_faults::Service;
use ruststream_faults::Target;

const SERVICE: &str = env!("CARGO_BIN_EXE_dead-letter-service");
const MESSAGES: usize = 20;

struct Case {
    target: Target,
    source: String,
    dead: String,
    group: String,
}

impl Case {
    async fn new(transport: &'static str) -> Self {
        let target = Target::new(SERVICE, transport).await;
        let (source, group) = target.address().await;
        let (dead, _) = target.address().await;
        Self {
            target,
            source,
            dead,
            group,
        }
    }

    fn args(&self) -> Vec<String> {
        [
            self.target.transport,
            &self.target.url,
            &self.source,
            &self.dead,
            &self.group,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Runs a command of the service's command line to its end.
    fn command(&self, command: &[&str], env: &[(&str, &str)]) -> Output {
        let mut run = Command::new(SERVICE);
        run.args(self.args()).args(command);
        for (name, value) in env {
            run.env(name, value);
        }
        run.output().expect("run dead-letter-service")
    }

    fn service(&self, env: &[(&str, &str)]) -> Service {
        let args = self.args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Service::spawn_with(SERVICE, &args, env)
    }

    /// The dead letters `list` shows, one line each.
    fn listed(&self) -> Vec<String> {
        let out = self.command(&["dead-letters", "list", "orders", "--limit", "100"], &[]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect()
    }

    /// Waits until `list` shows `n` dead letters.
    async fn until_listed(&self, n: usize, limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        loop {
            let listed = self.listed();
            if listed.len() == n || Instant::now() > deadline {
                assert_eq!(listed.len(), n, "dead letters listed: {listed:#?}");
                return listed;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Starts a replay that waits `slow_ms` before each publish and SIGKILLs it once it has
/// said `replayed` `after` times; the lines it printed.
fn replay_killed_midway(case: &Case, after: usize) -> Vec<String> {
    let mut child = Command::new(SERVICE)
        .args(case.args())
        .args(["dead-letters", "replay", "orders"])
        .env("DL_SLOW_MS", "300")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the replay");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("a line");
        let replayed = line.starts_with("replayed ");
        lines.push(line);
        if replayed && lines.iter().filter(|l| l.starts_with("replayed ")).count() == after {
            child.kill().expect("SIGKILL the replay");
            break;
        }
    }
    let _ = child.wait();
    lines
}

async fn dead_letters_are_replayed(transport: &'static str, says_why: bool) {
    let case = Case::new(transport).await;
    let published: BTreeSet<String> = case.target.publish(&case.source, MESSAGES).await;

    // A broken handler: every message dead-lettered after its second attempt.
    let mut broken = case.service(&[("DL_BROKEN", "1")]);
    let listed = case.until_listed(MESSAGES, Duration::from_secs(120)).await;
    broken.signal("TERM");
    broken.exits_within(Duration::from_secs(30)).await;
    for line in &listed {
        let payload = line.rsplit("payload ").next().unwrap_or_default();
        assert!(published.contains(payload), "{line}");
        if says_why {
            assert!(line.contains("reason retry()"), "{line}");
            assert!(line.contains("attempts 2"), "{line}");
        }
    }

    // Fixed: a replay killed midway, then run again.
    let mut fixed = case.service(&[]);
    let first = replay_killed_midway(&case, 5);
    assert!(
        first.iter().filter(|l| l.starts_with("replayed ")).count() == 5,
        "{first:#?}"
    );
    let again = case.command(&["dead-letters", "replay", "orders"], &[]);
    assert_eq!(again.status.code(), Some(0), "{}", text(&again));
    fixed
        .until(
            Duration::from_secs(120),
            "every replayed message handled",
            |t| t.handled().is_superset(&published),
        )
        .await;
    case.until_listed(0, Duration::from_secs(30)).await;
    fixed.signal("TERM");
    fixed.exits_within(Duration::from_secs(30)).await;

    // A letter replayed three times already is refused, and stays.
    let mut letter = Outgoing::new(case.dead.clone(), Bytes::from("m-bound"));
    letter.headers.insert(REPLAYS_HEADER, "3");
    letter
        .headers
        .insert(DEAD_LETTER_SOURCE, case.source.clone());
    case.target
        .publisher
        .publish(letter)
        .await
        .expect("a letter replayed three times");
    case.until_listed(1, Duration::from_secs(30)).await;
    let refused = case.command(&["dead-letters", "replay", "orders"], &[]);
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(
        text(&refused).contains("replayed 3 time(s) already, the bound is 3"),
        "{}",
        text(&refused)
    );
    case.until_listed(1, Duration::from_secs(30)).await;
}

#[tokio::test]
async fn kafka_dead_letters_say_why_and_are_replayed_once_fixed() {
    dead_letters_are_replayed("kafka-tracked", true).await;
}

#[tokio::test]
async fn jetstream_dead_letters_say_why_and_are_replayed_once_fixed() {
    dead_letters_are_replayed("jetstream", true).await;
}

#[tokio::test]
async fn rabbitmq_dead_letters_say_why_and_are_replayed_once_fixed() {
    dead_letters_are_replayed("rabbitmq-classic", true).await;
}

#[tokio::test]
async fn redis_dead_letters_say_why_and_are_replayed_once_fixed() {
    dead_letters_are_replayed("redis", true).await;
}

/// Pulsar's dead letters are written by its client's dead-letter policy, which adds no
/// reason: they are listed and replayed all the same, to the registration's address.
#[tokio::test]
async fn pulsar_dead_letters_are_replayed_once_fixed() {
    dead_letters_are_replayed("pulsar", false).await;
}
