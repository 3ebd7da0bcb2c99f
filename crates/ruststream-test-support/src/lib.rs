//! What the transports' integration tests share: a scripted handler that records every
//! call, polling with a deadline, names no other test uses, and the process's log.
//! (nextest runs each test in a process of its own, so the log is the test's.)

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

pub mod asyncapi;
pub mod bench;
pub mod ops;
pub mod overlap;
pub mod publish_bench;
pub mod pulsar_relay;
pub mod rabbit_broker;
pub mod trace;

use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::{Delivery, HandlerOutcome, Headers};

/// One handler call as a test sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The attempt number.
    pub attempt: u32,
    /// The address (topic, subject) it was read from.
    pub address: String,
    /// The key.
    pub key: Option<Bytes>,
    /// The headers.
    pub headers: Headers,
    /// The payload.
    pub payload: Bytes,
    /// Kafka partition.
    pub partition: Option<i32>,
    /// Kafka offset.
    pub offset: Option<i64>,
    /// Stream sequence.
    pub sequence: Option<u64>,
    /// When the handler ran.
    pub at: Instant,
}

type Decide = Box<dyn Fn(&Delivery) -> HandlerOutcome + Send + Sync>;

/// A handler whose outcome a test decides, recording every call.
pub struct Script {
    calls: Mutex<Vec<Seen>>,
    decide: Decide,
    work: Duration,
}

impl Script {
    /// Answers each delivery with `decide`.
    pub fn new(decide: impl Fn(&Delivery) -> HandlerOutcome + Send + Sync + 'static) -> Arc<Self> {
        Self::slow(Duration::ZERO, decide)
    }

    /// Like [`Script::new`], working `work` before answering.
    pub fn slow(
        work: Duration,
        decide: impl Fn(&Delivery) -> HandlerOutcome + Send + Sync + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            decide: Box::new(decide),
            work,
        })
    }

    /// Records a call.
    pub fn record(&self, delivery: &Delivery) {
        let metadata = delivery.metadata();
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Seen {
                attempt: delivery.attempt().number(),
                address: delivery.address().to_owned(),
                key: delivery.key().cloned(),
                headers: delivery.headers().clone(),
                payload: delivery.payload().clone(),
                partition: metadata.partition,
                offset: metadata.offset,
                sequence: metadata.sequence,
                at: Instant::now(),
            });
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Seen> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many calls so far.
    pub fn count(&self) -> usize {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// What [`handler`] returns: an async closure usable as a ruststream handler.
pub type ScriptedFuture = Pin<Box<dyn Future<Output = HandlerOutcome> + Send>>;

/// A handler running `script`.
pub fn handler(
    script: Arc<Script>,
) -> impl Fn(Delivery) -> ScriptedFuture + Clone + Send + Sync + 'static {
    move |delivery: Delivery| {
        let script = Arc::clone(&script);
        Box::pin(async move {
            script.record(&delivery);
            if !script.work.is_zero() {
                tokio::time::sleep(script.work).await;
            }
            (script.decide)(&delivery)
        })
    }
}

/// Polls `condition` until it holds; fails the test after `limit` with the last log lines.
pub async fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        if Instant::now() >= deadline {
            let log = logs();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            panic!(
                "not within {limit:?}: {what}\nlast log lines:\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A port nothing listens on now, for a broker of a test's own. Taken below the
/// system's range for outgoing connections (32768 and up here), which the system's own
/// pick (`bind` to port 0) shares: a client's connection made meanwhile cannot take it.
/// Where to start looking is spread by process, clock and counter, so tests running at
/// once look in different places; the test brokers' fixed ports (14222 to 25673) are
/// skipped by the bind check like any other taken port.
pub fn free_port() -> u16 {
    const FIRST: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let spread = std::process::id()
        .wrapping_mul(7_919)
        .wrapping_add(nanos / 1_000)
        .wrapping_add(u32::try_from(N.fetch_add(1, Ordering::Relaxed) % 1_000).unwrap_or(0) * 97);
    (0..SPAN)
        .map(|i| FIRST + (spread.wrapping_add(i)) % SPAN)
        .filter_map(|port| u16::try_from(port).ok())
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free local port below the system's range")
}

/// A suffix no other test (or earlier run) uses: process id, clock, counter.
pub fn unique_suffix() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Everything logged in this process since [`capture_logs`].
pub fn logs() -> String {
    String::from_utf8_lossy(
        &LOG.get_or_init(Default::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    )
    .into_owned()
}

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

/// Sends this process's `tracing` output (at `filter`, an env-filter string) to [`logs`].
pub fn capture_logs(filter: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

/// Checks a waiting start (SPEC G7) that warns every 2 s: it went through no sooner than
/// `late` (when the broker began to listen), logged between 1 and 4 WARN lines naming
/// `address` meanwhile, and one INFO once through. Returns how many WARN lines.
pub fn assert_waited(address: &str, took: Duration, late: Duration) -> usize {
    let logs = logs();
    let warnings = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("waiting for it") && l.contains(address))
        .count();
    assert!(
        took >= late,
        "through after {took:?}, before the broker listened"
    );
    assert!(
        (1..=4).contains(&warnings),
        "one WARN per 2 s over {late:?}, got {warnings}:\n{logs}"
    );
    assert!(
        logs.contains("the broker answers; starting"),
        "an INFO once through"
    );
    warnings
}

/// A plain TCP forwarder to `to` (`host:port`) on a free local port, listening only once
/// `after` passed (a broker that comes up late). Returns its address.
pub async fn forward_later(to: String, after: Duration) -> std::net::SocketAddr {
    use tokio::net::{TcpListener, TcpStream};
    let address = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("address");
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let listener = TcpListener::bind(address)
            .await
            .expect("bind the late forwarder");
        while let Ok((mut client, _)) = listener.accept().await {
            let to = to.clone();
            tokio::spawn(async move {
                if let Ok(mut upstream) = TcpStream::connect(&to).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
            });
        }
    });
    address
}

/// A TCP relay to a broker, on a free local port, whose client-to-broker direction can be
/// made to swallow what it reads (SPEC G3's transient failures, injected for one test
/// without touching the broker other tests share): a request sent meanwhile never
/// reaches the broker, so its answer never comes and the client times out, and nothing
/// arrives twice when the relay heals. Broker-to-client bytes always pass.
pub struct Relay {
    address: std::net::SocketAddr,
    swallowing: Arc<AtomicBool>,
}

impl Relay {
    /// Starts relaying every connection made to [`Relay::address`] to `to` (`host:port`).
    pub async fn start(to: String) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        let address = listener.local_addr().expect("address");
        let swallowing = Arc::new(AtomicBool::new(false));
        let swallow = Arc::clone(&swallowing);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(upstream) = tokio::net::TcpStream::connect(&to).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut upstream_read, mut upstream_write) = upstream.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut upstream_read, &mut client_write).await;
                });
                let swallow = Arc::clone(&swallow);
                tokio::spawn(async move {
                    let mut chunk = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = client_read.read(&mut chunk).await {
                        if swallow.load(Ordering::SeqCst) {
                            continue;
                        }
                        if upstream_write.write_all(&chunk[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        Self {
            address,
            swallowing,
        }
    }

    /// Where clients connect.
    pub fn address(&self) -> std::net::SocketAddr {
        self.address
    }

    /// From now on, what clients send is dropped (until [`Relay::heal`]).
    pub fn swallow(&self) {
        self.swallowing.store(true, Ordering::SeqCst);
    }

    /// What clients send passes again.
    pub fn heal(&self) {
        self.swallowing.store(false, Ordering::SeqCst);
    }
}

/// CPU time this process has used so far (user and system), from `/proc/self/stat`.
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("reading /proc/self/stat");
    // Fields after the command name, which ends with the last `)`.
    let rest = &stat[stat.rfind(')').expect("a /proc stat line") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line (11 and 12 here), in clock ticks
    // of USER_HZ, which is 100 on Linux.
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// Measures what a process spends while `window` passes: CPU time as a share of one core.
pub async fn cpu_share_over(window: Duration) -> f64 {
    let before = cpu_time();
    tokio::time::sleep(window).await;
    (cpu_time() - before).as_secs_f64() / window.as_secs_f64()
}

/// Prints a `RELIABILITY|transport|what was tried|lost|duplicated|dead-lettered` line for
/// `scripts/reliability`.
pub fn reliability(transport: &str, tried: &str, lost: &str, duplicated: &str, dead: &str) {
    println!("RELIABILITY|{transport}|{tried}|{lost}|{duplicated}|{dead}");
}

/// Accepts the first connection on `listener` and asserts the client opened it with a
/// TLS ClientHello (a handshake record, 22, carrying message type 1), not a broker's own
/// protocol: how the tests check that TLS settings reached a client when the broker they
/// run has no TLS. The connection is closed after.
pub async fn assert_tls_client_hello(listener: &tokio::net::TcpListener) {
    use tokio::io::AsyncReadExt;
    let (mut socket, _) = tokio::time::timeout(Duration::from_secs(15), listener.accept())
        .await
        .expect("the client connects")
        .expect("accept");
    let mut bytes = vec![0; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut bytes))
        .await
        .expect("the client writes")
        .expect("read");
    assert!(
        n >= 6 && bytes[0] == 0x16 && bytes[5] == 0x01,
        "not a TLS ClientHello: {:?}",
        &bytes[..n]
    );
}

/// A self-signed CA certificate written to a PEM file of its own under the temp dir:
/// what a client told to trust a CA bundle loads (some load it when made, so it must be a
/// real certificate).
pub fn ca_pem_file(prefix: &str) -> std::path::PathBuf {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = params.self_signed(&key).expect("CA");
    let path = std::env::temp_dir().join(format!("{prefix}-{}.pem", unique_suffix()));
    std::fs::write(&path, ca.pem()).expect("CA file");
    path
}

/// No line [`capture_logs`] collected holds `secret`; the ones that do are shown.
pub fn assert_no_log_line_holds(secret: &str) {
    let logged = logs();
    let holding: Vec<&str> = logged.lines().filter(|l| l.contains(secret)).collect();
    assert!(
        holding.is_empty(),
        "log lines hold a secret:\n{}",
        holding.join("\n")
    );
}

/// Accepts every connection on `listener` and closes it at once: a broker address where
/// nothing ever completes a handshake.
pub fn close_every_connection(listener: tokio::net::TcpListener) {
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
}

/// Passwords holding the characters a careless URL reader stops at (`/`, `,`, `#`, `?`,
/// `@`, `://`, a space), raw and percent-encoded: issue #46's leaks. None shares four
/// characters in a row with a host, port or scheme the tests use.
pub const HOSTILE_PASSWORDS: [&str; 6] = [
    "Wrong/Pazzw0rd-777",
    "R3dis,S3cret-Qz",
    "ha#sh?qu@ery-Kj",
    "sch://emeXq:Vb",
    "sp ace Yw Zt",
    "pct%2Fenc%40Jx",
];

/// `shown` holds no four characters in a row of `password` (raw or percent-decoded).
pub fn assert_shows_no_part_of(shown: &str, password: &str) {
    let chars: Vec<char> = password.chars().collect();
    for window in chars.windows(4) {
        let window: String = window.iter().collect();
        assert!(
            !shown.contains(&window),
            "{window:?} of password {password:?} is printed: {shown}"
        );
    }
}

/// No log line [`capture_logs`] collected holds four characters in a row of `password`.
pub fn assert_no_log_line_holds_part_of(password: &str) {
    let logged = logs();
    for line in logged.lines() {
        assert_shows_no_part_of(line, password);
    }
}
