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

/// Starts a nats-server of the test's own on a port it picks itself, from the binary the
/// test command installed (a missing one fails the test), and returns once it listens.
/// (A port found free here could be taken by another test's server before this one
/// binds it; the server would exit, and the other one answer in its place.)
pub async fn own_server<A: AsRef<std::ffi::OsStr>>(args: &[A]) -> OwnServer {
    use std::time::{Duration, Instant};
    let binary =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.brokers/bin/nats-server");
    assert!(
        binary.exists(),
        "{} is missing: run the tests with scripts/test, which installs it",
        binary.display()
    );
    let ports = std::env::temp_dir().join(unique("nats-ports"));
    std::fs::create_dir_all(&ports).expect("a directory for the ports file");
    let mut process = tokio::process::Command::new(&binary)
        .args(["-a", "127.0.0.1", "-p", "-1", "--ports_file_dir"])
        .arg(&ports)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server starts");
    // `<ports dir>/nats-server_<pid>.ports`: {"nats":["nats://127.0.0.1:<port>"], ...}
    let file = ports.join(format!(
        "nats-server_{}.ports",
        process.id().expect("a pid")
    ));
    let deadline = Instant::now() + Duration::from_secs(10);
    let address = loop {
        assert!(
            process.try_wait().expect("the server's state").is_none(),
            "nats-server exited at start"
        );
        let written = std::fs::read_to_string(&file).ok();
        // The scheme is `tls` when the server asks for TLS.
        let found = written
            .and_then(|w| serde_json::from_str::<serde_json::Value>(&w).ok())
            .and_then(|v| Some(v["nats"][0].as_str()?.split_once("://")?.1.to_owned()));
        if let Some(address) = found {
            break address;
        }
        assert!(Instant::now() < deadline, "nats-server did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _ = std::fs::remove_dir_all(&ports);
    while tokio::net::TcpStream::connect(&address).await.is_err() {
        assert!(Instant::now() < deadline, "nats-server did not listen");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    OwnServer {
        _process: process,
        address,
    }
}
