//! What a consumer costs per message: the CPU time of the one thread it runs on, between
//! its first and its last message, next to a raw client loop in the same process.
//!
//! Wall-clock rates on a shared 2-core machine move by tens of percent; the CPU time of
//! the consuming thread moves far less, and does not count the publisher, the broker or
//! the client's own I/O threads (librdkafka's, the NATS connection task), which a raw loop
//! and ruststream share.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

/// CPU time the calling thread has run so far, in nanoseconds
/// (`/proc/thread-self/schedstat`, kept by the scheduler to the nanosecond).
pub fn thread_cpu_ns() -> u64 {
    thread_schedstat().0
}

/// The calling thread's CPU time in nanoseconds and the number of times it was put on a
/// CPU (each wake-up from a wait is one): `/proc/thread-self/schedstat`'s first and third
/// fields.
pub fn thread_schedstat() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("reading /proc/thread-self/schedstat");
    let mut fields = stat.split_whitespace().map(|f| f.parse().ok());
    let ns = fields.next().flatten().expect("a schedstat line");
    let slices = fields.nth(1).flatten().expect("a schedstat line");
    (ns, slices)
}

/// The CPU time of a broker's process, found by the port it listens on (`ss -ltnp`),
/// read from `/proc/<pid>/stat` (user + system, in the kernel's 10 ms ticks).
#[derive(Debug, Clone)]
pub struct BrokerCpu {
    pid: String,
}

impl BrokerCpu {
    /// The process listening on the port of `url` (`scheme://[user@]host:port[/path]` or
    /// `host:port`); fails the bench when nothing listens there.
    pub fn listening_at(url: &str) -> Self {
        let authority = url.split("://").last().unwrap_or(url);
        let host_port = authority.split('/').next().unwrap_or(authority);
        let port = host_port.rsplit(':').next().expect("a port");
        let out = std::process::Command::new("ss")
            .args(["-Hltnp", &format!("sport = :{port}")])
            .output()
            .expect("ss");
        let text = String::from_utf8_lossy(&out.stdout);
        let at = text
            .find("pid=")
            .unwrap_or_else(|| panic!("nothing listens on port {port}"));
        let pid = text[at + 4..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Self { pid }
    }

    /// Its CPU time so far, in nanoseconds.
    pub fn ns(&self) -> u64 {
        process_cpu_ns(&self.pid)
    }
}

/// CPU time (user + system) of process `pid` (or `self`) so far, in nanoseconds.
pub fn process_cpu_ns(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // The fields after the command (which may hold spaces) start after its `)`.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..]
        .split_whitespace()
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    // The kernel's USER_HZ is 100 on Linux.
    ticks * 10_000_000
}

/// Runs `side` and returns its result with the broker CPU it cost per message.
pub async fn with_broker_cpu<T>(
    broker: &BrokerCpu,
    messages: usize,
    side: impl Future<Output = T>,
) -> (T, f64) {
    let before = broker.ns();
    let result = side.await;
    (result, (broker.ns() - before) as f64 / messages as f64)
}

/// A count from the environment variable `name`, or `default`: benches take their
/// message and round counts this way (a callgrind run wants fewer).
pub fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The 1-minute load average, as `/proc/loadavg` says.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// The first and the last of `target` messages: when, and the handling thread's CPU.
#[derive(Debug)]
pub struct Span {
    target: usize,
    count: usize,
    first: Option<(Instant, (u64, u64))>,
    last: Option<(Instant, (u64, u64))>,
}

impl Span {
    /// A span ending at message `target`.
    pub fn new(target: usize) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            target,
            count: 0,
            first: None,
            last: None,
        }))
    }

    /// One message handled, on the consuming thread.
    pub fn hit(span: &Mutex<Self>) {
        let mut span = span.lock().unwrap_or_else(PoisonError::into_inner);
        span.count += 1;
        if span.count == 1 {
            span.first = Some((Instant::now(), thread_schedstat()));
        } else if span.count == span.target {
            span.last = Some((Instant::now(), thread_schedstat()));
        }
    }

    /// `n` messages handled at once (a batch), on the consuming thread.
    pub fn hit_many(span: &Mutex<Self>, n: usize) {
        let mut span = span.lock().unwrap_or_else(PoisonError::into_inner);
        let before = span.count;
        span.count += n;
        if before == 0 {
            span.first = Some((Instant::now(), thread_schedstat()));
        }
        if before < span.target && span.count >= span.target {
            span.last = Some((Instant::now(), thread_schedstat()));
        }
    }

    /// Waits (on the consuming thread) until `target` messages came, or none came for
    /// `quiet` after the first one (messages lost), or `limit` passed (panics).
    pub async fn wait(span: &Mutex<Self>, quiet: std::time::Duration, limit: std::time::Duration) {
        let started = Instant::now();
        let (mut seen, mut since) = (0, Instant::now());
        loop {
            let count = Self::count(span);
            if count == span.lock().unwrap_or_else(PoisonError::into_inner).target {
                return;
            }
            if count != seen {
                (seen, since) = (count, Instant::now());
            } else if count > 0 && since.elapsed() >= quiet {
                return;
            }
            assert!(
                started.elapsed() < limit,
                "only {count} messages within {limit:?}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Messages handled so far.
    pub fn count(span: &Mutex<Self>) -> usize {
        span.lock().unwrap_or_else(PoisonError::into_inner).count
    }

    /// The figures, read on the consuming thread. When fewer than `target` messages came
    /// (Core NATS drops), the span ends now, on that thread.
    pub fn figures(span: &Mutex<Self>) -> Figures {
        let mut span = span.lock().unwrap_or_else(PoisonError::into_inner);
        let (t0, (c0, s0)) = span.first.expect("a first message");
        let (t1, (c1, s1)) = *span
            .last
            .get_or_insert_with(|| (Instant::now(), thread_schedstat()));
        let between = (span.count.max(2) - 1) as f64;
        Figures {
            cpu_ns: (c1 - c0) as f64 / between,
            wakeups_per_1000: (s1 - s0) as f64 * 1000.0 / between,
            rate: between / (t1 - t0).as_secs_f64(),
            handled: span.count,
            expected: span.target,
        }
    }
}

/// Per message: the consuming thread's CPU time, and the rate.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// CPU nanoseconds per message on the consuming thread.
    pub cpu_ns: f64,
    /// Times the consuming thread was put on a CPU, per 1,000 messages: each wake-up
    /// from a wait costs CPU time (the kernel's part counts) that an instruction count
    /// does not show.
    pub wakeups_per_1000: f64,
    /// Messages per second, first to last.
    pub rate: f64,
    /// Messages handled.
    pub handled: usize,
    /// Messages sent.
    pub expected: usize,
}

/// Which side of a round a consumer thread runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The loop a user would write with the raw client.
    Raw,
    /// An app with one registration.
    Ruststream,
}

/// Runs `consumer` on a thread of its own, in a current-thread tokio runtime: what it
/// spawns (an app's driver and lanes) runs on that thread too, so the thread's CPU time
/// is the consumer's alone. The thread's whole work runs inside a function named after
/// `side` ([`raw_side`] or [`ruststream_side`]), so callgrind counts each side's thread
/// apart (`scripts/bench-callgrind-transport`).
pub async fn own_thread<T, F>(side: Side, consumer: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: Future<Output = T>,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("consumer".to_owned())
        .spawn(move || {
            let run = move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime");
                runtime.block_on(consumer())
            };
            let _ = tx.send(match side {
                Side::Raw => raw_side(run),
                Side::Ruststream => ruststream_side(run),
            });
        })
        .expect("a consumer thread");
    rx.await
        .expect("the consumer thread ended without an answer")
}

/// Everything a raw-client consumer thread does (callgrind counts under this name).
#[inline(never)]
pub fn raw_side<T>(run: impl FnOnce() -> T) -> T {
    // Not the same body as `ruststream_side`, which the compiler would merge with it.
    std::hint::black_box(Side::Raw);
    run()
}

/// Everything a ruststream consumer thread does (callgrind counts under this name).
#[inline(never)]
pub fn ruststream_side<T>(run: impl FnOnce() -> T) -> T {
    std::hint::black_box(Side::Ruststream);
    run()
}

/// The ruststream side of a round: an app with one registration of the descriptor
/// `descriptor` makes and [`handle`], on a thread of its own (as [`own_thread`]), until
/// `messages` were handled or nothing moved for `limit`; its figures.
pub async fn through_app<D>(
    messages: usize,
    limit: std::time::Duration,
    descriptor: impl FnOnce() -> D + Send + 'static,
) -> Figures
where
    D: ruststream::core::Descriptor,
{
    own_thread(Side::Ruststream, move || async move {
        let span = Span::new(messages);
        let app = ruststream::App::new().state(Arc::clone(&span));
        let running = register(app, descriptor()).start().await.expect("start");
        Span::wait(&span, limit, limit).await;
        let figures = Span::figures(&span);
        running.stop().await;
        figures
    })
    .await
}

/// Messages per batch on the ruststream side: `BENCH_BATCH` (unset or 0: one message per
/// call, as `on` registers).
pub fn batch_size() -> usize {
    env_count("BENCH_BATCH", 0)
}

/// Registers the benchmarks' handler on `descriptor`: [`handle`] through `on`, or, with
/// `BENCH_BATCH=n`, [`handle_batch`] through `on_batch` with `max_batch(n)`.
pub fn register<D: ruststream::core::Descriptor>(
    app: ruststream::App,
    descriptor: D,
) -> ruststream::App {
    match batch_size() {
        0 => app.register(ruststream::on(descriptor, handle)),
        n => app.register(
            ruststream::on_batch(descriptor, handle_batch)
                .max_batch(n)
                .max_wait(std::time::Duration::from_millis(5)),
        ),
    }
}

/// Runs both sides of one round, `raw` first on even rounds and `framework` first on odd
/// ones, so neither side always runs on the warmer broker; returns (raw, framework).
pub async fn in_turn<R, F, RawF, FwF>(
    round: usize,
    raw: impl FnOnce() -> RawF,
    framework: impl FnOnce() -> FwF,
) -> (R, F)
where
    RawF: Future<Output = R>,
    FwF: Future<Output = F>,
{
    if round % 2 == 0 {
        let r = raw().await;
        (r, framework().await)
    } else {
        let f = framework().await;
        (raw().await, f)
    }
}

/// One line comparing ruststream with the raw loop over interleaved rounds: each side's
/// lowest CPU per message (the least disturbed round) and highest rate, and the ratios.
pub fn report(path: &str, raw: &[Figures], framework: &[Figures], load: &str) -> String {
    let cpu = |f: &[Figures]| f.iter().map(|f| f.cpu_ns).fold(f64::INFINITY, f64::min);
    let rate = |f: &[Figures]| f.iter().map(|f| f.rate).fold(0.0, f64::max);
    let rounds: Vec<String> = raw
        .iter()
        .zip(framework)
        .map(|(r, f)| {
            format!(
                "{:.0}/{:.0} ({:.1}/{:.1} wake-ups per 1,000)",
                r.cpu_ns, f.cpu_ns, r.wakeups_per_1000, f.wakeups_per_1000
            )
        })
        .collect();
    let lost = |f: &[Figures]| -> String {
        let lost: Vec<String> = f
            .iter()
            .map(|f| (f.expected - f.handled).to_string())
            .collect();
        lost.join("/")
    };
    format!(
        "{path}: CPU ns/msg raw {:.0}, ruststream {:.0} ({:.2}x); rate raw {:.0}/s, ruststream {:.0}/s ({:.2}x); rounds raw/ruststream ns {}; lost per round raw {} ruststream {}; load {load}",
        cpu(raw),
        cpu(framework),
        cpu(framework) / cpu(raw),
        rate(raw),
        rate(framework),
        rate(framework) / rate(raw),
        rounds.join(" "),
        lost(raw),
        lost(framework),
    )
}

/// The message every consume benchmark decodes (`{id,price,qty,buy}`, serde_json).
#[derive(Debug, serde::Deserialize)]
pub struct Tick {
    /// Order id.
    pub id: u64,
    /// Price.
    pub price: u32,
    /// Quantity.
    pub qty: u16,
    /// Side.
    pub buy: bool,
}

/// A [`Tick`] as the benchmarks publish it.
pub const PAYLOAD: &[u8] = br#"{"id":123456,"price":4200,"qty":7,"buy":true}"#;

/// The benchmarks' handler: decode (by the extractor), count, ack.
pub async fn handle(
    ruststream::Message(tick): ruststream::Message<Tick>,
    ruststream::State(span): ruststream::State<Arc<Mutex<Span>>>,
) -> ruststream::HandlerOutcome {
    std::hint::black_box(tick);
    Span::hit(&span);
    ruststream::HandlerOutcome::ack()
}

/// The benchmarks' batch handler: every element decoded (by the `Batch` extractor),
/// counted, all acked.
pub async fn handle_batch(
    batch: ruststream::batch::Batch<Tick>,
    ruststream::State(span): ruststream::State<Arc<Mutex<Span>>>,
) -> ruststream::BatchOutcome {
    std::hint::black_box(&*batch);
    Span::hit_many(&span, batch.len());
    ruststream::BatchOutcome::ack_all()
}
