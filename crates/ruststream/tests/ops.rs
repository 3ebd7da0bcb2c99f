//! The ops endpoint on the memory broker: every outcome counted once, copies and dead
//! letters counted, health and readiness through a stop (issue #14).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Message, State, on};
use ruststream_test_support::ops::{get, sample};
use tokio::sync::Semaphore;

async fn answer(Message(word): Message<String>) -> Result<HandlerOutcome, String> {
    match word.as_str() {
        "ack" => Ok(HandlerOutcome::ack()),
        "drop" => Ok(HandlerOutcome::drop()),
        "fail" => Err("refused".to_owned()),
        "later" => Ok(HandlerOutcome::retry_after(Duration::from_millis(10))),
        _ => Ok(HandlerOutcome::retry()),
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn ops_metrics_count_every_outcome_copy_and_dead_letter() {
    let broker = MemoryBroker::recording();
    let app = App::new().ops(0).register(
        on(broker.topic("words").runtime_retries(), answer)
            .name("words")
            .max_attempts(3)
            .dead_letter("words.dead"),
    );
    let running = app.start().await.unwrap();
    let addr = running.ops_addr().expect("ops endpoint on");
    assert!(addr.ip().is_loopback(), "App::ops binds 127.0.0.1");
    let publisher = broker.publisher();
    // 3 acks, 2 drops, 1 that always fails (3 attempts, then a dead letter), 1 that
    // always asks again (the same), 1 answered retry_after (3 attempts, dead letter).
    for word in [
        "ack", "ack", "ack", "drop", "drop", "fail", "again", "later",
    ] {
        publisher.to("words").send(word).await.unwrap();
    }
    // And one that does not decode: dead-lettered at once, counted as undecodable.
    publisher.to("words").send_bytes("not json").await.unwrap();
    wait_until("four dead letters", || {
        broker.published("words.dead").len() == 4
    })
    .await;
    wait_until("nothing in flight", || running.in_flight() == 0).await;

    let (status, metrics) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let words = [
        "registration=\"words\"",
        "address=\"words\"",
        "transport=\"memory\"",
    ];
    let count = |name: &str, kind: Option<&str>| {
        let kind = kind.map(|k| format!("kind=\"{k}\""));
        let mut parts = words.to_vec();
        parts.extend(kind.as_deref());
        sample(&metrics, name, &parts)
    };
    // 9 originals + 2 retry copies for each of the 3 that never succeed.
    assert_eq!(
        count("ruststream_deliveries_total", None),
        15.0,
        "{metrics}"
    );
    assert_eq!(count("ruststream_outcomes_total", Some("ack")), 3.0);
    assert_eq!(count("ruststream_outcomes_total", Some("drop")), 2.0);
    // Every attempt counts as the handler answered, the last ones too (issue #46): the
    // dead letters are counted apart, once confirmed.
    assert_eq!(count("ruststream_outcomes_total", Some("error")), 3.0);
    assert_eq!(count("ruststream_outcomes_total", Some("retry")), 3.0);
    assert_eq!(count("ruststream_outcomes_total", Some("retry_after")), 3.0);
    assert_eq!(count("ruststream_outcomes_total", Some("undecodable")), 1.0);
    assert!(!metrics.contains("dead_lettered"), "no such kind any more");
    assert_eq!(
        count("ruststream_copies_published_total", Some("retry_copy")),
        6.0
    );
    assert_eq!(
        count("ruststream_copies_published_total", Some("dead_letter")),
        4.0
    );
    assert_eq!(
        count("ruststream_handler_duration_seconds_count", None),
        15.0
    );
    assert_eq!(count("ruststream_in_flight", None), 0.0);
    assert_eq!(count("ruststream_delayed", None), 0.0);
    assert_eq!(count("ruststream_copy_failures_total", None), 0.0);
    assert_eq!(get(addr, "/health/live").await.0, 200);
    assert_eq!(
        get(addr, "/health/ready").await,
        (200, "ready\n".to_owned())
    );
    assert_eq!(get(addr, "/nothing").await.0, 404);
    running.stop().await;
}

async fn blocks(Message(_): Message<String>, State(gate): State<Arc<Semaphore>>) -> HandlerOutcome {
    let _permit = gate.acquire().await;
    HandlerOutcome::ack()
}

#[tokio::test]
async fn ops_ready_after_start_and_not_ready_while_draining() {
    let broker = MemoryBroker::new();
    let gate = Arc::new(Semaphore::new(0));
    let app = App::new()
        .ops(0)
        .state(Arc::clone(&gate))
        .register(on(broker.topic("jobs"), blocks).name("jobs"));
    let running = app.start().await.unwrap();
    let addr = running.ops_addr().unwrap();
    assert_eq!(
        get(addr, "/health/ready").await.0,
        200,
        "ready once started"
    );
    broker.publisher().to("jobs").send("x").await.unwrap();
    broker.publisher().to("jobs").send("y").await.unwrap();
    wait_until("one running, one queued", || running.in_flight() == 2).await;
    let metrics = get(addr, "/metrics").await.1;
    let jobs = ["registration=\"jobs\""];
    assert_eq!(
        sample(&metrics, "ruststream_in_flight", &jobs),
        2.0,
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "ruststream_running", &jobs),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "ruststream_delayed", &jobs),
        0.0,
        "{metrics}"
    );
    let stopping = tokio::spawn(running.stop());
    // The handler holds the drain open: the endpoint still answers, not ready.
    let (status, body) = get(addr, "/health/ready").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("stopping"), "{body}");
    assert_eq!(
        get(addr, "/health/live").await.0,
        200,
        "live while draining"
    );
    gate.add_permits(2);
    stopping.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the endpoint closes with the app"
    );
}

#[tokio::test]
async fn ops_off_by_default_and_a_taken_port_is_a_start_error() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .register(on(broker.topic("a"), answer))
        .start()
        .await
        .unwrap();
    assert!(running.ops_addr().is_none());
    assert!(running.metrics().await.is_none());
    running.stop().await;

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let error = App::new()
        .ops(port)
        .register(on(broker.topic("a"), answer))
        .start()
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(text.contains("ops endpoint"), "{text}");
}

/// Whether the server closed `socket` (a read returns 0 or fails) within `within`.
async fn closed_within(socket: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut byte = [0_u8; 1];
    matches!(
        tokio::time::timeout(within, socket.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Issue #46, item 9: the ops endpoint holds at most 128 connections (one more is closed
/// at once), closes a connection idle for 10 s, and a probe gets through once idle ones
/// are gone. Before: 2,000 idle connections held for 40 s and more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_endpoint_caps_its_connections_and_closes_idle_ones() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .ops(0)
        .register(on(broker.topic("a"), answer))
        .start()
        .await
        .unwrap();
    let addr = running.ops_addr().expect("serving");
    let mut idle = Vec::new();
    for _ in 0..128 {
        idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    // Past the limit: accepted by the kernel, closed by the server unread.
    let mut over = tokio::net::TcpStream::connect(addr).await.expect("connect");
    assert!(
        closed_within(&mut over, Duration::from_secs(5)).await,
        "the 129th connection is closed at once"
    );
    // The idle ones are closed after about 10 s, not held.
    let started = Instant::now();
    for socket in &mut idle {
        assert!(
            closed_within(socket, Duration::from_secs(15)).await,
            "an idle connection closed"
        );
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(8),
        "closed after {took:?}, before the idle timeout"
    );
    let (status, body) = get(addr, "/health/live").await;
    assert_eq!(
        (status, body.as_str()),
        (200, "live\n"),
        "a probe gets through"
    );
    running.stop().await;
}

async fn store_all(batch: ruststream::batch::Batch<String>) -> ruststream::BatchOutcome {
    let mut outcome = ruststream::BatchOutcome::ack_all();
    for (i, item) in batch.iter().enumerate() {
        if item.value == "drop" {
            outcome.set(i, HandlerOutcome::drop());
        }
    }
    outcome
}

/// A batch registration's metrics: every message counted as alone (deliveries, outcomes,
/// handler calls per message), and the size of every batch in `ruststream_batch_size`.
#[tokio::test]
async fn ops_a_batch_registration_counts_each_message_and_observes_batch_sizes() {
    let broker = MemoryBroker::new();
    let app = App::new().ops(0).register(
        ruststream::on_batch(broker.topic("rows"), store_all)
            .name("rows")
            .max_batch(10),
    );
    let running = app.start().await.unwrap();
    let addr = running.ops_addr().expect("ops endpoint on");
    let rows = (0..25).map(|n| {
        let word = if n == 7 { "drop" } else { "keep" };
        ruststream::core::Outgoing::new("rows", format!("\"{word}\""))
    });
    let sent = broker.publisher().send_all(rows).await;
    assert!(sent.iter().all(Result::is_ok));
    let rows = ["registration=\"rows\"", "address=\"rows\""];
    let handled = |metrics: &str, kind: &str| {
        let kind = format!("kind=\"{kind}\"");
        sample(
            metrics,
            "ruststream_outcomes_total",
            &[rows[0], rows[1], &kind],
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let (_, metrics) = get(addr, "/metrics").await;
        if handled(&metrics, "ack") + handled(&metrics, "drop") == 25.0 {
            break metrics;
        }
        assert!(Instant::now() < deadline, "not all 25 handled: {metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let count = |name: &str, kind: Option<&str>| {
        let kind = kind.map(|k| format!("kind=\"{k}\""));
        let mut parts = rows.to_vec();
        parts.extend(kind.as_deref());
        sample(&metrics, name, &parts)
    };
    assert_eq!(
        count("ruststream_deliveries_total", None),
        25.0,
        "{metrics}"
    );
    assert_eq!(
        count("ruststream_outcomes_total", Some("ack")),
        24.0,
        "{metrics}"
    );
    assert_eq!(count("ruststream_outcomes_total", Some("drop")), 1.0);
    assert_eq!(count("ruststream_batch_size_sum", None), 25.0);
    let batches = count("ruststream_batch_size_count", None);
    assert!(
        (3.0..=25.0).contains(&batches),
        "{batches} batches of at most 10"
    );
    running.stop().await;
}

/// `consumers(3)`: the metrics count the three consumers as one registration (one series
/// each, their sum), and the app is ready once all three are open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_consumers_are_counted_as_one_registration() {
    let broker = MemoryBroker::new();
    let app = App::new()
        .ops(0)
        .register(on(broker.topic("words"), answer).name("words").consumers(3));
    let running = app.start().await.unwrap();
    let addr = running.ops_addr().expect("ops endpoint on");
    let (status, _) = get(addr, "/health/ready").await;
    assert_eq!(status, 200, "ready once every consumer is open");
    let words = (0..30).map(|_| ruststream::core::Outgoing::new("words", "\"ack\""));
    let sent = broker.publisher().send_all(words).await;
    assert!(sent.iter().all(Result::is_ok));
    let labels = ["registration=\"words\"", "address=\"words\""];
    let deadline = Instant::now() + Duration::from_secs(20);
    let metrics = loop {
        let (_, metrics) = get(addr, "/metrics").await;
        if sample(&metrics, "ruststream_deliveries_total", &labels) == 30.0 {
            break metrics;
        }
        assert!(Instant::now() < deadline, "not all 30 counted: {metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for series in ["ruststream_deliveries_total{", "ruststream_in_flight{"] {
        let lines = metrics
            .lines()
            .filter(|l| l.starts_with(series) && l.contains(labels[0]))
            .count();
        assert_eq!(
            lines, 1,
            "one {series}..}} series for three consumers: {metrics}"
        );
    }
    running.stop().await;
}
