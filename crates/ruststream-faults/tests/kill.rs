//! SIGKILL the service (a separate process, `fault-service`) while its handlers run and
//! while `retry_after` waits, restart it, and count: every published message must end
//! acked, except where the spec documents a loss window (Core NATS, Kafka `Commit::Auto`),
//! which is measured and reported instead of asserted.

use std::time::Duration;

use ruststream_faults::{HOLD, Report, Target, assert_waited, soak};

const SERVICE: &str = env!("CARGO_BIN_EXE_fault-service");

/// Kills the service after a quarter of the messages were handled (handlers work 50 ms
/// each in 4 lanes, so several are running), restarts it, and reports. Returns the lost
/// count.
async fn kill_while_handlers_run(transport: &'static str, why_lost: &str) -> usize {
    kill_while_running(transport, "slow", why_lost).await
}

/// [`kill_while_handlers_run`] for a batch registration (`max_batch(20)`, 4 lanes, 50 ms
/// per batch call): killed while batches run.
async fn kill_while_batches_run(transport: &'static str) -> usize {
    kill_while_running(transport, "batch", "").await
}

async fn kill_while_running(transport: &'static str, mode: &str, why_lost: &str) -> usize {
    let target = Target::new(SERVICE, transport).await;
    let n = 200 * soak();
    let (address, group, published, mut first) = target.first_life(n, mode).await;
    first
        .until(Duration::from_secs(90), "a quarter handled", |t| {
            t.done.len() >= n / 4
        })
        .await;
    let first = first.kill().await;
    let running = first.started.len() - first.done.len();

    let second = target.restart(&address, &group, &published, &first).await;
    let report = Report {
        published,
        lives: vec![first, second],
    };
    report.print(
        target.label,
        &format!(
            "{n} messages{}, service SIGKILLed after {} acks with handlers running: {running}, restarted",
            if mode == "batch" { " to a batch handler" } else { "" },
            report.lives[0].done.len()
        ),
        why_lost,
    );
    report.lost()
}

/// Every message's first attempt asks `retry_after(3 s)`; the service is killed during
/// the wait and restarted. Returns the lost count.
async fn kill_during_retry_after(transport: &'static str, why_lost: &str) -> usize {
    let target = Target::new(SERVICE, transport).await;
    let n = 10 * soak();
    let (address, group, published, mut first) = target.first_life(n, "hold").await;
    first
        .until(Duration::from_secs(90), "every message held", |t| {
            t.held.len() >= n
        })
        .await;
    // Let the settlements the holds make right away (a NAK with delay) reach the broker.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = first.kill().await;

    let second = target.restart(&address, &group, &published, &first).await;
    if target.transport == "jetstream" {
        // The server holds the wait (`-NAK` with a delay), so it outlives the process.
        assert_waited(&first.held, &second.done, HOLD);
    }
    let report = Report {
        published,
        lives: vec![first, second],
    };
    report.print(
        target.label,
        &format!(
            "{n} messages, service SIGKILLed while each waited in retry_after(3 s), restarted"
        ),
        why_lost,
    );
    report.lost()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_jetstream_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("jetstream", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_jetstream_sigkill_during_retry_after_loses_nothing() {
    // The delay is held by the server (`-NAK` with a delay), not by the process.
    assert_eq!(kill_during_retry_after("jetstream", "").await, 0);
}

/// Core NATS is at-most-once (N2): what the killed process had received and not finished
/// is gone. Measured, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n2_core_sigkill_while_handlers_run_loss_is_measured() {
    kill_while_handlers_run("core", "at-most-once by design, N2").await;
}

/// N8: the copy waits in the process; a kill loses it. Measured, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n8_core_sigkill_during_retry_after_loss_is_measured() {
    kill_during_retry_after("core", "the copies waited in the killed process, N8").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_tracked_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("kafka-tracked", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_d2_tracked_sigkill_during_retry_after_loses_nothing() {
    // The offset waits for the copy, so the records are read again after the restart.
    assert_eq!(kill_during_retry_after("kafka-tracked", "").await, 0);
}

/// K2: librdkafka stored the offsets when it handed the records over. Measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k2_auto_sigkill_while_handlers_run_loss_is_measured() {
    kill_while_handlers_run(
        "kafka-auto",
        "offsets stored at hand-over and auto-committed, K2",
    )
    .await;
}

/// K7: under Auto the copy waits in the process and the offset has moved on. Measured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_auto_sigkill_during_retry_after_loss_is_measured() {
    kill_during_retry_after("kafka-auto", "the copies waited in the killed process, K7").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_pulsar_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("pulsar", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p7_pulsar_sigkill_during_retry_after_loses_nothing() {
    // The held message was never acknowledged; the broker redelivers it once the
    // connection is gone.
    assert_eq!(kill_during_retry_after("pulsar", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_transactional_sigkill_while_handlers_run_loses_nothing() {
    // The killed window never committed its offsets: it is read again after the restart.
    assert_eq!(kill_while_handlers_run("kafka-transactional", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k7_d2_transactional_sigkill_during_retry_after_loses_nothing() {
    // A record waiting for its retry copy holds the window's position back.
    assert_eq!(kill_during_retry_after("kafka-transactional", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_classic_sigkill_while_handlers_run_loses_nothing() {
    // Unacknowledged deliveries go back to the queue when the connection dies.
    assert_eq!(kill_while_handlers_run("rabbitmq-classic", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_rabbitmq_classic_sigkill_during_retry_after_loses_nothing() {
    // The original stays unacknowledged until its copy is confirmed (R4).
    assert_eq!(kill_during_retry_after("rabbitmq-classic", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_quorum_sigkill_while_handlers_run_loses_nothing() {
    assert_eq!(kill_while_handlers_run("rabbitmq-quorum", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r4_rabbitmq_quorum_sigkill_during_retry_after_loses_nothing() {
    // Held unacknowledged in the killed process: the broker gives it back (R4).
    assert_eq!(kill_during_retry_after("rabbitmq-quorum", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_redis_sigkill_while_handlers_run_loses_nothing() {
    // What the killed life held is claimed by the next once idle for the claim timeout.
    assert_eq!(kill_while_handlers_run("redis", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s4_redis_sigkill_during_retry_after_loses_nothing() {
    // The waits were pending in Redis: the next life claims them.
    assert_eq!(kill_during_retry_after("redis", "").await, 0);
}

/// SIGKILL while batches run: every persisting broker brings back what the killed
/// process's batches held (K3, K6, N1, P1, R2, S2, one message at a time as alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n1_jetstream_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("jetstream").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_tracked_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("kafka-tracked").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_transactional_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("kafka-transactional").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p1_pulsar_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("pulsar").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_classic_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("rabbitmq-classic").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2_rabbitmq_quorum_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("rabbitmq-quorum").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s2_redis_sigkill_while_batches_run_loses_nothing() {
    assert_eq!(kill_while_batches_run("redis").await, 0);
}
