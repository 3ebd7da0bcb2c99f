//! Shared test support: the real server, unique names, scripted handlers, captured logs.
#![allow(dead_code, unreachable_pub, unused_imports)]

use ruststream_nats::Nats;
use ruststream_nats::async_nats::jetstream::{self, stream};
pub use ruststream_test_support::{
    Script, Seen, assert_waited, capture_logs, eventually, forward_later, handler, logs,
    unique_suffix,
};

/// The server the project's test command started. A missing server fails the test.
pub async fn nats() -> Nats {
    capture_logs("debug,async_nats=info");
    let url = std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_NATS_URL is not set: run the tests with scripts/test, which starts nats-server")
    });
    Nats::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the NATS tests need a running nats-server: {e}"))
}

/// A name no other test (or earlier run) uses (subject tokens and stream names alike).
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", unique_suffix().replace('-', "_"))
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

/// Sends `which` (`-STOP`, `-CONT`) to process `pid`: to freeze a server and thaw it.
#[allow(dead_code)]
pub fn signal(pid: u32, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill {which} {pid}");
}

/// A nats-server of the test's own, killed when dropped.
pub struct OwnServer {
    _process: tokio::process::Child,
    /// `127.0.0.1:port`.
    pub address: String,
}

impl OwnServer {
    /// The server's process id (to freeze it with SIGSTOP).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self._process.id().expect("the server runs")
    }
}

/// Starts a nats-server of the test's own on a free port with `args`, from the binary the
/// test command installed (a missing one fails the test), and returns once it listens.
pub async fn own_server<A: AsRef<std::ffi::OsStr>>(args: &[A]) -> OwnServer {
    use std::time::{Duration, Instant};
    let binary =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.brokers/bin/nats-server");
    assert!(
        binary.exists(),
        "{} is missing: run the tests with scripts/test, which installs it",
        binary.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let process = tokio::process::Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server starts");
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&address).await.is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    OwnServer {
        _process: process,
        address,
    }
}
