//! Shared test support: pulsar-lite through the frame relay, unique names, scripted
//! handlers, captured logs.
#![allow(dead_code, unreachable_pub)]

pub mod relay;

use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::{Delivery, HandlerOutcome, Headers};
use ruststream_pulsar::Pulsar;

/// pulsar-lite, reached through a relay that adds the checksum section its message
/// frames leave out (see `relay.rs`). A missing broker fails the test.
pub async fn pulsar() -> Pulsar {
    capture_logs();
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_PULSAR_ADDR is not set: run the tests with scripts/test, which starts pulsar-lite")
    });
    if tokio::net::TcpStream::connect(&broker).await.is_err() {
        panic!("the Pulsar tests need pulsar-lite listening at {broker}");
    }
    let relay = relay::start(broker).await;
    Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .unwrap_or_else(|e| panic!("connecting through the relay: {e}"))
}

/// A topic name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "persistent://public/default/{prefix}-{}-{}-{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One handler call as a test sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub attempt: u32,
    pub topic: String,
    pub key: Option<Bytes>,
    pub headers: Headers,
    pub payload: Bytes,
    pub at: Instant,
}

/// A handler whose outcome a test decides, recording every call.
pub struct Script {
    pub calls: Mutex<Vec<Seen>>,
    decide: Box<dyn Fn(&Delivery) -> HandlerOutcome + Send + Sync>,
}

impl Script {
    pub fn new(decide: impl Fn(&Delivery) -> HandlerOutcome + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            calls: Mutex::new(Vec::new()),
            decide: Box::new(decide),
        })
    }

    pub fn calls(&self) -> Vec<Seen> {
        self.calls.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.calls.lock().unwrap().len()
    }
}

/// A handler (an async closure) running `script`.
pub fn handler(
    script: Arc<Script>,
) -> impl Fn(Delivery) -> std::pin::Pin<Box<dyn Future<Output = HandlerOutcome> + Send>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |delivery: Delivery| {
        let script = Arc::clone(&script);
        Box::pin(async move {
            script.calls.lock().unwrap().push(Seen {
                attempt: delivery.attempt().number(),
                topic: delivery.address().to_owned(),
                key: delivery.key().cloned(),
                headers: delivery.headers().clone(),
                payload: delivery.payload().clone(),
                at: Instant::now(),
            });
            (script.decide)(&delivery)
        })
    }
}

/// Polls `condition` until it holds, failing the test after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        if Instant::now() >= deadline {
            let log = logs();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "not within {limit:?}: {what}\nlast log lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Everything logged in this test process (each nextest test is its own process).
pub fn logs() -> String {
    String::from_utf8_lossy(&LOG.get_or_init(Default::default).lock().unwrap()).into_owned()
}

static LOG: OnceLock<Mutex<Vec<u8>>> = OnceLock::new();

struct Capture;

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOG.get_or_init(Default::default)
            .lock()
            .unwrap()
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("debug,pulsar=debug")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}
