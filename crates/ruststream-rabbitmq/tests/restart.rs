//! A rabbitmq-server of the test's own, SIGKILLed and started again under a running app:
//! the connection is made again, the consumer reads on, and no message the broker
//! confirmed is lost (durable queues, classic and quorum, persistent messages).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ruststream::{App, Delivery, HandlerOutcome, Headers, on};
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_test_support::rabbit_broker::OwnRabbit;
use ruststream_test_support::{eventually, unique_suffix};

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
async fn r8_a_classic_queue_reads_on_after_a_broker_restart_and_nothing_confirmed_is_lost() {
    restart_under_a_running_app(QueueKind::Classic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_a_quorum_queue_reads_on_after_a_broker_restart_and_nothing_confirmed_is_lost() {
    restart_under_a_running_app(QueueKind::Quorum).await;
}

async fn restart_under_a_running_app(kind: QueueKind) {
    ruststream_test_support::capture_logs("info,lapin=warn");
    let broker = OwnRabbit::new();
    broker.start().await;
    let rabbit = RabbitMq::connect(&broker.url()).await.expect("connect");
    let queue = format!("restart-{}", unique_suffix());
    rabbit.declare_queue(&queue, kind).await.expect("declared");
    // A quorum queue declared moments ago would not survive the SIGKILL (a RabbitMQ 3.10
    // limit, see `restart_gracefully`); the connection is made again after this too.
    broker.restart_gracefully().await;
    let handled: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let seen = Arc::clone(&handled);
    let running = App::new()
        .ops(0)
        .register(on(rabbit.queue(&queue).kind(kind), move |d: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .insert(String::from_utf8_lossy(d.payload()).into_owned());
                HandlerOutcome::ack()
            }
        }))
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
    ready_becomes(&running, 503).await;
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
    ready_becomes(&running, 200).await;
    running.stop().await;
}

/// Polls `/health/ready` until its status is `want` (readiness follows the connection).
async fn ready_becomes(running: &ruststream::Running, want: u16) {
    let addr = running.ops_addr().expect("ops endpoint on");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = ruststream_test_support::ops::get(addr, "/health/ready").await;
        if status == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/health/ready stayed {status} ({body:?}), expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A classic queue's `retry_after` waits with the original unacknowledged (R5, D2). When
/// the connection is lost during the wait, the broker gives the original back, it is read
/// again and waits again, and the first wait makes no copy: one copy in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r5_d2_a_wait_whose_channel_is_lost_makes_no_copy() {
    ruststream_test_support::capture_logs("info,lapin=warn");
    let broker = OwnRabbit::new();
    broker.start().await;
    let rabbit = RabbitMq::connect(&broker.url()).await.expect("connect");
    let queue = format!("rewait-{}", unique_suffix());
    let kind = QueueKind::Classic;
    rabbit.declare_queue(&queue, kind).await.expect("declared");
    // (originals read, copies read)
    let reads: Arc<Mutex<(u32, u32)>> = Arc::default();
    let seen = Arc::clone(&reads);
    let running = App::new()
        .ops(0)
        .register(on(rabbit.queue(&queue).kind(kind), move |d: Delivery| {
            let seen = Arc::clone(&seen);
            async move {
                let mut seen = seen.lock().unwrap();
                if d.headers().get("x-ruststream-retry-count").is_some() {
                    seen.1 += 1;
                    return HandlerOutcome::ack();
                }
                seen.0 += 1;
                // Longer than the broker's restart below.
                HandlerOutcome::retry_after(Duration::from_secs(10))
            }
        }))
        .start()
        .await
        .expect("starts");
    confirmed(&rabbit, &queue, "held").await;
    eventually(Duration::from_secs(30), "the original read", || {
        reads.lock().unwrap().0 >= 1
    })
    .await;
    broker.restart_gracefully().await;
    eventually(Duration::from_secs(60), "the original read again", || {
        reads.lock().unwrap().0 >= 2
    })
    .await;
    eventually(Duration::from_secs(30), "a copy read", || {
        reads.lock().unwrap().1 >= 1
    })
    .await;
    // Both waits have ended: the first one long since.
    tokio::time::sleep(Duration::from_secs(3)).await;
    running.stop().await;
    let (originals, copies) = *reads.lock().unwrap();
    assert_eq!(
        copies, 1,
        "one copy, made by the wait of the original's last read ({originals} reads of it)"
    );
}
