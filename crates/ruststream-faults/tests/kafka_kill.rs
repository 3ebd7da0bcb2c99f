//! SIGKILL an exactly-once (`Commit::Transactional`) service before its window commits.
//! (The other commit modes are killed in `kill.rs`.)

use std::process::Stdio;
use std::time::{Duration, Instant};

use ruststream::Headers;
use ruststream_faults::kafka::{brokers, create_topics};
use ruststream_faults::unique;
use ruststream_kafka::Kafka;
use ruststream_kafka::rdkafka::config::ClientConfig;
use ruststream_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use ruststream_kafka::rdkafka::{Offset, TopicPartitionList};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The committed offset (None: nothing committed yet), read on a thread of its own
/// (dropping clients can block). A failed read fails the test.
async fn committed(group: &str, topic: &str) -> Option<i64> {
    let (group, topic) = (group.to_owned(), topic.to_owned());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", &group)
            .create()
            .expect("consumer");
        let mut list = TopicPartitionList::new();
        list.add_partition(&topic, 0);
        let offset = consumer
            .committed_offsets(list, Duration::from_secs(10))
            .map(|l| l.find_partition(&topic, 0).map(|e| e.offset()));
        std::mem::forget(consumer);
        let _ = tx.send(offset);
    });
    match rx
        .await
        .expect("committed offsets read")
        .expect("the broker answered the committed-offset request")
    {
        Some(Offset::Offset(o)) => Some(o),
        Some(Offset::Invalid) => None,
        other => panic!("unexpected committed position {other:?}"),
    }
}

fn spawn(program: &str, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(program)
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the service starts");
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    (child, lines)
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> String {
    tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the service printed within 60 s")
        .expect("stdout readable")
        .expect("the service is still running")
}

/// Kills an exactly-once service after it produced its outputs and before its window
/// committed: the window's offsets never moved, and after the restart every input is
/// handled again and committed once. (That the killed window's outputs are hidden from
/// read_committed consumers cannot be observed on tansu; see the Kafka crate's eos tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_sigkill_before_the_window_commits_replays_it_and_the_offsets_match() {
    let (input, output, group, id) = (
        unique("eos-kill-in"),
        unique("eos-kill-out"),
        unique("g"),
        unique("tx"),
    );
    create_topics(&brokers(), &[&input, &output]).await;
    let kafka = Kafka::connect(&brokers()).expect("client");
    for i in 0..3 {
        kafka
            .publisher()
            .send(
                &input,
                None,
                &Headers::new(),
                format!("in-{i}").as_bytes(),
                None,
            )
            .await
            .expect("produced");
    }
    let program = env!("CARGO_BIN_EXE_kafka-eos-service");
    // A window of a minute: the kill comes before it can commit.
    let (mut first, mut lines) = spawn(
        program,
        &[&brokers(), &input, &output, &group, &id, "60000"],
    );
    // (A rebalance right after the group forms may abort and replay the first window.)
    let all = ["handled in-0", "handled in-1", "handled in-2"];
    let mut handled = std::collections::BTreeSet::new();
    while !all.iter().all(|l| handled.contains(*l)) {
        handled.insert(next_line(&mut lines).await);
    }
    first.kill().await.expect("SIGKILL");
    assert_eq!(
        committed(&group, &input).await,
        None,
        "the killed window committed nothing"
    );

    let (mut second, mut lines) =
        spawn(program, &[&brokers(), &input, &output, &group, &id, "100"]);
    let mut again = std::collections::BTreeSet::new();
    while !all.iter().all(|l| again.contains(*l)) {
        again.insert(next_line(&mut lines).await);
    }
    assert_eq!(again, handled, "the window is read again after the restart");
    let deadline = Instant::now() + Duration::from_secs(30);
    while committed(&group, &input).await != Some(3) {
        assert!(
            Instant::now() < deadline,
            "the replayed window did not commit"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    second.kill().await.expect("stopped");
    println!(
        "RELIABILITY|Kafka Commit::Transactional|3 records, service SIGKILLed after producing, before its window committed, restarted|lost 0 of 3; offsets committed once, at 3|the killed window's outputs are aborted (not observable on tansu)|none declared"
    );
}
