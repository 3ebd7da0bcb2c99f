//! The guard rails beyond the seeds (SPEC G1, G2) on the memory broker, through the
//! production runtime, and a backlog that must not keep the runtime's thread.

use std::io::Write;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use ruststream::batch::Batch;
use ruststream::core::Outgoing;
use ruststream::memory::MemoryBroker;
use ruststream::middleware::Completion;
use ruststream::testing::TestApp;
use ruststream::{
    App, Backoff, BatchOutcome, HandlerOutcome, Meta, RETRY_COUNT_HEADER, State, on, on_batch,
};

static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

fn logs() -> String {
    String::from_utf8_lossy(&LOG.get_or_init(Default::default).lock().unwrap()).into_owned()
}

async fn panics_always(meta: Meta) -> HandlerOutcome {
    panic!("boom at attempt {}", meta.attempt.number());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_an_uncapped_panic_loop_is_logged_at_attempts_1_10_100_not_every_time() {
    capture_logs();
    let broker = MemoryBroker::recording();
    let app = App::new().register(on(broker.topic("loops"), panics_always).name("loops"));
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("loops", &1u32).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while test.calls().len() < 150 {
        assert!(Instant::now() < deadline, "150 attempts");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    test.stop().await;
    let log = logs();
    let errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("handler panicked") && l.contains("registration=\"loops\""))
        .collect();
    assert_eq!(errors.len(), 3, "{errors:#?}");
    for (line, attempt) in errors
        .iter()
        .zip(["attempt=1 ", "attempt=10 ", "attempt=100 "])
    {
        assert!(line.contains("ERROR") && line.contains(attempt), "{line}");
    }
    let warnings = log
        .lines()
        .filter(|l| l.contains("keeps failing") && l.contains("registration=\"loops\""))
        .count();
    assert_eq!(warnings, 2, "WARN at attempts 10 and 100");
    // `.cargo/config.toml` sets RUST_LIB_BACKTRACE, so the runtime captures backtraces.
    assert_eq!(
        log.matches("backtrace=").count(),
        1,
        "a backtrace once per message, with the first of its 3 ERROR lines"
    );
    assert!(
        errors[0].contains("backtrace=") && log.contains("panics_always"),
        "the backtrace is the first attempt's and names the panicking handler"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_a_timed_out_attempt_counts_toward_the_cap_and_dead_letters() {
    let broker = MemoryBroker::recording();
    let hangs = |_meta: Meta| async {
        std::future::pending::<()>().await;
        HandlerOutcome::ack()
    };
    let app = App::new()
        .handler_timeout(Duration::from_millis(100))
        .register(
            on(broker.topic("slow"), hangs)
                .max_attempts(2)
                .dead_letter("slow.dead"),
        );
    let test = TestApp::recording(app, &broker).await.unwrap();
    test.publish("slow", &1u32).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 2, "max_attempts runs");
    assert!(
        calls
            .iter()
            .all(|c| c.completion == Completion::TimedOut(Duration::from_millis(100))),
        "the app-wide default applies"
    );
    assert_eq!(
        broker.published("slow.dead").len(),
        1,
        "dead-lettered at the cap"
    );
    test.stop().await;
}

/// Fails its first three calls of a message, each a different way: an `Err`, a panic,
/// the deadline; acks from the fourth attempt.
async fn fails_three_ways(batch: Batch<u32>) -> Result<BatchOutcome, String> {
    match batch.iter().map(|item| item.attempt().number()).min() {
        Some(1) => Err("the database said no".into()),
        Some(2) => panic!("boom in a batch"),
        Some(3) => std::future::pending().await,
        _ => Ok(BatchOutcome::ack_all()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_a_failed_batch_is_reported_once_not_once_per_message() {
    capture_logs();
    let broker = MemoryBroker::recording();
    let app = App::new().register(
        on_batch(broker.topic("rows"), fails_three_ways)
            .name("batched")
            .max_batch(30)
            .max_wait(Duration::from_millis(200))
            .timeout(Duration::from_millis(100))
            .max_attempts(5)
            .dead_letter("rows.dead"),
    );
    let test = TestApp::start(app, &broker).await.unwrap();
    let rows = (0..30u32).map(|n| Outgoing::new("rows", n.to_string()));
    assert!(
        test.publisher()
            .send_all(rows)
            .await
            .iter()
            .all(Result::is_ok)
    );
    test.settled().await;
    test.stop().await;
    assert!(
        broker.published("rows.dead").is_empty(),
        "all acked at attempt 4"
    );
    let log = logs();
    let ours = |l: &&str| l.contains("registration=\"batched\"");
    let per_message: Vec<&str> = log
        .lines()
        .filter(ours)
        .filter(|l| l.contains("runtime::lane:"))
        .collect();
    assert!(
        per_message.is_empty(),
        "one line per message: {per_message:#?}"
    );
    // Each failure once per call, loud (capped: every attempt), with how many it held.
    for (what, level, attempt) in [
        ("batch handler returned an error", "WARN", "attempts=1 "),
        ("batch handler panicked", "ERROR", "attempts=2 "),
        ("batch handler passed its deadline", "ERROR", "attempts=3 "),
    ] {
        let lines: Vec<&str> = log
            .lines()
            .filter(ours)
            .filter(|l| l.contains(what))
            .collect();
        let messages: usize = lines
            .iter()
            .map(|l| {
                assert!(
                    l.contains(level) && l.contains(attempt) && l.contains("address=\"rows\""),
                    "{l}"
                );
                let held = l
                    .split("batch=")
                    .nth(1)
                    .and_then(|rest| rest.split(' ').next());
                held.and_then(|n| n.parse::<usize>().ok()).expect("batch=n")
            })
            .sum();
        assert_eq!(
            messages, 30,
            "{what}: every message, in as many lines as calls: {lines:#?}"
        );
        assert!(
            lines.len() <= 3,
            "{what}: one line per call, not per message: {lines:#?}"
        );
    }
}

async fn retry_then_ack(meta: Meta) -> HandlerOutcome {
    if meta.attempt.number() < 3 {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

async fn backoff_delays_retries(runtime_retries: bool) {
    let broker = MemoryBroker::recording();
    let topic = broker.topic("later");
    let topic = if runtime_retries {
        topic.runtime_retries()
    } else {
        topic
    };
    let backoff = Backoff::exponential(Duration::from_millis(200), Duration::from_secs(1));
    let app = App::new().register(
        on(topic, retry_then_ack)
            .max_attempts(5)
            .dead_letter("later.dead")
            .backoff(backoff),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    let started = Instant::now();
    test.publish("later", &1u32).await;
    test.settled().await;
    let calls = test.calls();
    assert_eq!(calls.len(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "200 ms, then 400 ms: {:?}",
        started.elapsed()
    );
    assert_eq!(
        calls[0].plan.copy.is_some(),
        runtime_retries,
        "{:?}",
        calls[0].plan
    );
    if runtime_retries {
        assert_eq!(calls[2].headers.get_str(RETRY_COUNT_HEADER), Some("2"));
    }
    test.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_backoff_turns_retry_into_a_delayed_redelivery_natively() {
    backoff_delays_retries(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g2_backoff_turns_retry_into_a_delayed_copy_on_the_runtime_path() {
    backoff_delays_retries(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_parked_retry_afters_stop_fetching_at_max_in_flight() {
    let broker = MemoryBroker::recording();
    let parks = |_meta: Meta| async { HandlerOutcome::retry_after(Duration::from_secs(60)) };
    let app = App::new().register(
        on(broker.topic("park").runtime_retries(), parks)
            .max_attempts(3)
            .max_in_flight(100)
            .lanes(4),
    );
    let test = TestApp::recording(app, &broker).await.unwrap();
    for n in 0..2_000u32 {
        test.publish("park", &n).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while test.calls().len() < 100 {
        assert!(Instant::now() < deadline, "the bound reached");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(test.calls().len(), 100, "nothing fetched past the bound");
    test.stop().await;
}

/// A broker with a backlog answers every fetch at once. The subscription's driver must
/// still give its thread back now and then (every 128 deliveries), or a backlog
/// keeps everything else on that thread waiting until it is gone: timers, handler
/// deadlines, other registrations, the health endpoint.
#[tokio::test]
async fn a_backlog_does_not_keep_the_thread_from_other_tasks() {
    const BACKLOG: usize = 10_000;
    let broker = MemoryBroker::with_capacity(BACKLOG + 1);
    let message = ruststream::core::Outgoing::new("backlog", bytes::Bytes::from_static(b"1"));
    for _ in 0..BACKLOG {
        broker.publish(message.clone()).await;
    }
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = |State(handled): State<std::sync::Arc<std::sync::atomic::AtomicUsize>>| async move {
        handled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        HandlerOutcome::ack()
    };
    let running = App::new()
        .state(std::sync::Arc::clone(&handled))
        .register(on(broker.topic("backlog"), count))
        .start()
        .await
        .unwrap();
    // This test's runtime has one thread: a task spawned now runs when the driver, queued
    // before it, gives the thread back.
    let probe = std::sync::Arc::clone(&handled);
    let seen = tokio::spawn(async move { probe.load(std::sync::atomic::Ordering::Relaxed) })
        .await
        .unwrap();
    assert!(
        seen < BACKLOG / 10,
        "the driver kept the thread for {seen} of {BACKLOG} deliveries"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while handled.load(std::sync::atomic::Ordering::Relaxed) < BACKLOG {
        assert!(Instant::now() < deadline, "the backlog drained");
        tokio::task::yield_now().await;
    }
    running.stop().await;
}

/// Issue #46, item 14: with `lanes(4)` and keyless messages, a handler that hangs holds
/// back only its own delivery: the nine published after it all run while it still hangs
/// (each goes to a free lane, never queued behind the hung one). Before: keyless
/// deliveries were dealt round robin, some queued behind the hung handler, and once its
/// queue was full the fetch stopped for every lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g1_a_hung_keyless_handler_holds_back_no_other_delivery() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Semaphore;

    #[derive(Clone)]
    struct Gate {
        release: Arc<Semaphore>,
        others: Arc<AtomicUsize>,
    }
    let gate = Gate {
        release: Arc::new(Semaphore::new(0)),
        others: Arc::new(AtomicUsize::new(0)),
    };
    let work = |State(gate): State<Gate>,
                ruststream::Message(word): ruststream::Message<String>| async move {
        if word == "hang" {
            let _ = gate.release.acquire().await;
        } else {
            gate.others.fetch_add(1, Ordering::SeqCst);
        }
        HandlerOutcome::ack()
    };
    let broker = MemoryBroker::new();
    let running = App::new()
        .state(gate.clone())
        .register(on(broker.topic("work"), work).lanes(4))
        .start()
        .await
        .unwrap();
    let publisher = broker.publisher();
    publisher.to("work").send(&"hang").await.unwrap();
    for n in 0..9 {
        publisher
            .to("work")
            .send(&format!("quick-{n}"))
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while gate.others.load(Ordering::SeqCst) < 9 {
        assert!(
            Instant::now() < deadline,
            "{} of 9 ran while one handler hangs",
            gate.others.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        gate.release.available_permits(),
        0,
        "still hanging meanwhile"
    );
    gate.release.add_permits(1);
    running.stop().await;
}

/// What a batch handler saw of a backlog: the busy key's messages so far, and how many
/// of those had come when each batch of the rare keys did.
#[derive(Default)]
struct Seen {
    busy: std::sync::atomic::AtomicUsize,
    rare_after: Mutex<Vec<usize>>,
}

async fn note_keys(
    batch: Batch<u32>,
    State(seen): State<std::sync::Arc<Seen>>,
) -> Result<BatchOutcome, String> {
    use std::sync::atomic::Ordering::SeqCst;
    for item in batch.iter() {
        if item.key().is_some_and(|k| k.starts_with(b"rare")) {
            let busy = seen.busy.load(SeqCst);
            seen.rare_after.lock().unwrap().push(busy);
        } else {
            seen.busy.fetch_add(1, SeqCst);
        }
    }
    Ok(BatchOutcome::ack_all())
}

/// A backlog's driver gives its thread back every 128 deliveries, and each time also looks
/// at what its straight line does not: a batch on a lane the backlog's key does not reach
/// is cut at its `max_wait`, not only once the backlog is gone (a quiet key's messages
/// would otherwise wait, in flight, for the whole backlog).
#[tokio::test]
async fn a_backlog_still_cuts_a_quiet_lanes_batch_at_its_max_wait() {
    const BACKLOG: usize = 20_000;
    const RARE: usize = 16;
    let broker = MemoryBroker::with_capacity(BACKLOG + RARE + 1);
    // Sixteen keys of one message each: some land on another lane than the busy key.
    let keyed = |key: String| {
        let mut message = Outgoing::new("keyed", "1");
        message.key = Some(key.into());
        message
    };
    for n in 0..RARE {
        broker.publish(keyed(format!("rare-{n}"))).await;
    }
    for _ in 0..BACKLOG {
        broker.publish(keyed("busy".to_owned())).await;
    }
    let seen = std::sync::Arc::new(Seen::default());
    let running = App::new()
        .state(std::sync::Arc::clone(&seen))
        .register(
            on_batch(broker.topic("keyed"), note_keys)
                .lanes(2)
                .max_batch(100)
                // Short next to the backlog (some 30 ms in a debug build here).
                .max_wait(Duration::from_millis(1)),
        )
        .start()
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.busy.load(std::sync::atomic::Ordering::SeqCst) < BACKLOG {
        assert!(Instant::now() < deadline, "the backlog drained");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
    let rare_after = seen.rare_after.lock().unwrap().clone();
    assert_eq!(rare_after.len(), RARE, "every rare key's message came");
    assert!(
        rare_after.iter().all(|&busy| busy < BACKLOG / 2),
        "a quiet lane's batch waited for the backlog: the busy key's count when each rare message came: {rare_after:?}"
    );
}
