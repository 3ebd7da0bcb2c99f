//! Connecting securely to Redis: a password (on a redis-server of this test's own that
//! requires one), TLS from a `rediss://` URL, and the password never printed.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ruststream::Headers;
use ruststream_redis::Redis;
use ruststream_test_support::{assert_no_log_line_holds, assert_tls_client_hello};
use tokio::net::TcpListener;

const PASSWORD: &str = "s3cret-redis-pass";

/// A redis-server on a free port that requires `PASSWORD`, killed on drop.
struct Guarded {
    child: Child,
    port: u16,
}

impl Guarded {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                PASSWORD,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (installed by the test command)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_url_authenticates_and_is_never_printed() {
    ruststream_test_support::capture_logs("trace");
    let server = Guarded::start();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", server.port);
    let redis = Redis::connect(&url).await.expect("authenticated");
    let id = redis
        .publisher()
        .send("secured", &Headers::new(), b"hello")
        .await
        .expect("XADD allowed");
    assert!(id.contains('-'), "an entry id: {id}");
    assert!(!format!("{redis:?}").contains(PASSWORD));

    let wrong = format!("redis://:not-the-password@127.0.0.1:{}", server.port);
    let error = Redis::connect_within(&wrong, Duration::from_secs(3))
        .await
        .expect_err("refused");
    let shown = format!("{error} {error:?}");
    assert!(
        shown.contains(&format!("127.0.0.1:{}", server.port)),
        "{shown}"
    );
    assert!(!shown.contains("not-the-password"), "{shown}");
    assert!(
        shown.contains("authentication failed"),
        "the server's answer: {shown}"
    );
    assert_no_log_line_holds(PASSWORD);
    assert_no_log_line_holds("not-the-password");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rediss_url_opens_with_a_tls_handshake_and_masks_the_password() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let address = listener.local_addr().expect("address").to_string();
    let url = format!("rediss://:{PASSWORD}@{address}");
    let connecting =
        tokio::spawn(async move { Redis::connect_within(&url, Duration::from_secs(3)).await });
    assert_tls_client_hello(&listener).await;
    let error = connecting
        .await
        .expect("joined")
        .expect_err("no Redis answers");
    let shown = format!("{error} {error:?}");
    assert!(shown.contains(&address), "{shown}");
    assert!(!shown.contains(PASSWORD), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_url_comes_from_the_environment() {
    use ruststream_core::{Env, FromEnvError};
    let prefix = format!("RS_REDIS_SEC_{}", std::process::id());
    let env = Env::new(&prefix);
    let missing = Redis::connect_from_env(&env).await.expect_err("no URL");
    assert!(matches!(missing, FromEnvError::Env(_)), "{missing}");
    assert!(
        missing.to_string().contains(&format!("{prefix}_URL")),
        "{missing}"
    );
}

/// Issue #46, item 1: a password holding `/`, `,`, `#`, `?` or `@` is masked whole in the
/// connect error (Display and Debug) and in every log line, refused by the real server or
/// by an address that closes every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_url_delimiters_is_never_printed() {
    ruststream_test_support::capture_logs("trace");
    let server = Guarded::start();
    let closing = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let closed = closing.local_addr().expect("address").to_string();
    ruststream_test_support::close_every_connection(closing);
    for password in ruststream_test_support::HOSTILE_PASSWORDS {
        for address in [format!("127.0.0.1:{}", server.port), closed.clone()] {
            let url = format!("redis://billing:{password}@{address}/0");
            let error = Redis::connect_within(&url, Duration::from_secs(3))
                .await
                .expect_err("refused");
            let shown = format!("{error} {error:?}");
            ruststream_test_support::assert_shows_no_part_of(&shown, password);
            assert!(shown.contains("redis://***@"), "{shown}");
        }
        ruststream_test_support::assert_no_log_line_holds_part_of(password);
    }
}
