//! Shared test support: the real server, unique names, scripted handlers, captured logs.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ruststream::{Delivery, HandlerOutcome, Headers};
use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};

/// The server the project's test command started. A missing server fails the test.
pub async fn nats() -> Nats {
    capture_logs();
    let url = std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_NATS_URL is not set: run the tests with scripts/test, which starts nats-server")
    });
    Nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the NATS tests need a running nats-server: {e}"))
}

/// A name no other test (or earlier run) uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}_{}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates stream `name` capturing `subjects`.
pub async fn create_stream(
    nats: &Nats,
    name: &str,
    subjects: &[String],
) -> jetstream::stream::Stream {
    jetstream::new(nats.client().clone())
        .create_stream(stream::Config {
            name: name.to_owned(),
            subjects: subjects.to_vec(),
            ..Default::default()
        })
        .await
        .expect("create stream")
}

/// One handler call as a test sees it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub attempt: u32,
    pub sequence: Option<u64>,
    pub subject: String,
    pub headers: Headers,
    pub payload: Bytes,
    pub at: Instant,
}

/// A handler whose outcome a test decides, recording every call.
pub struct Script {
    pub calls: Mutex<Vec<Seen>>,
    decide: Box<dyn Fn(&Delivery) -> HandlerOutcome + Send + Sync>,
    pub work: Duration,
}

impl Script {
    pub fn new(decide: impl Fn(&Delivery) -> HandlerOutcome + Send + Sync + 'static) -> Arc<Self> {
        Self::slow(Duration::ZERO, decide)
    }

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
                sequence: delivery.metadata().sequence,
                subject: delivery.address().to_owned(),
                headers: delivery.headers().clone(),
                payload: delivery.payload().clone(),
                at: Instant::now(),
            });
            if !script.work.is_zero() {
                tokio::time::sleep(script.work).await;
            }
            (script.decide)(&delivery)
        })
    }
}

/// Polls `condition` until it holds, failing the test after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
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
        .with_env_filter("debug,async_nats=info")
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}
