//! Token authentication and TLS on Pulsar. pulsar-lite, the broker the test command runs,
//! takes no TLS and no authentication, so these check that the settings reach the client,
//! against listeners of the test's own: the token is in the connection's first frame (the
//! `CONNECT` command), `pulsar+ssl://` with a CA bundle opens with a TLS ClientHello, and
//! neither the failed connection's error nor any log line holds the token.

mod common;

use std::time::Duration;

use common::{capture_logs, logs};
use ruststream_core::Secret;
use ruststream_pulsar::{Pulsar, Security};
use ruststream_test_support::{assert_tls_client_hello, ca_pem_file};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

const TOKEN: &str = "eyJhbGciOiJIUzI1NiJ9.pulsar-tok-7e21ab";

/// Reads the first Pulsar frame (a 4-byte big-endian size, then that many bytes) from the
/// first connection, then closes every connection.
async fn first_frame(listener: TcpListener) -> Vec<u8> {
    let (mut socket, _) = tokio::time::timeout(Duration::from_secs(15), listener.accept())
        .await
        .expect("the client connects")
        .expect("accept");
    let mut size = [0; 4];
    tokio::time::timeout(Duration::from_secs(5), socket.read_exact(&mut size))
        .await
        .expect("the client writes")
        .expect("a frame size");
    let mut frame = vec![0; u32::from_be_bytes(size) as usize];
    socket.read_exact(&mut frame).await.expect("a whole frame");
    drop(socket);
    ruststream_test_support::close_every_connection(listener);
    frame
}

fn holds(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_goes_in_connect_and_is_never_printed() {
    // Everything but the pulsar crate's TRACE lines on `pulsar::connection`, which print
    // each command sent, the CONNECT's token included (as a list of bytes): the README
    // says to keep that target at DEBUG or above.
    capture_logs("trace,pulsar::connection=debug");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let address = listener.local_addr().expect("address").to_string();
    let seen = tokio::spawn(first_frame(listener));
    let security = Security::token(Secret::new(TOKEN));
    let error = Pulsar::connect_with(
        &format!("pulsar://{address}"),
        &security,
        Duration::from_secs(3),
    )
    .await
    .expect_err("the listener answers no CONNECT");
    let frame = seen.await.expect("joined");
    assert!(holds(&frame, "token"), "no auth method in {frame:?}");
    assert!(holds(&frame, TOKEN), "no token in {frame:?}");

    let shown = format!("{error} {error:?} {security:?}");
    assert!(shown.contains(&address), "{shown}");
    assert!(!shown.contains(TOKEN), "{shown}");
    let logged = logs();
    let as_bytes = format!("{:?}", TOKEN.as_bytes());
    let as_bytes = as_bytes.trim_matches(['[', ']']);
    assert!(
        logged.contains(&address),
        "the failed connection is logged: {logged}"
    );
    let holding: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains(TOKEN) || l.contains(as_bytes))
        .collect();
    assert!(
        holding.is_empty(),
        "log lines hold the token:\n{}",
        holding.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulsar_ssl_with_a_ca_bundle_opens_with_a_tls_handshake() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let address = listener.local_addr().expect("address").to_string();
    let security = Security::token(Secret::new(TOKEN)).with_ca(ca_pem_file("pulsar-ca"));
    let url = format!("pulsar+ssl://{address}");
    let connecting =
        tokio::spawn(
            async move { Pulsar::connect_with(&url, &security, Duration::from_secs(3)).await },
        );
    assert_tls_client_hello(&listener).await;
    let error = connecting
        .await
        .expect("joined")
        .expect_err("no Pulsar broker answers");
    assert!(error.to_string().contains(&address), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_ca_bundle_is_an_error_naming_the_file() {
    let security = Security::none().with_ca("/nonexistent/pulsar-ca.pem");
    let error = Pulsar::connect_with(
        "pulsar+ssl://127.0.0.1:1",
        &security,
        Duration::from_secs(3),
    )
    .await
    .expect_err("no such file");
    assert!(
        error.to_string().contains("/nonexistent/pulsar-ca.pem"),
        "{error}"
    );
}

/// Issue #46, items 1 and 2: credentials in a Pulsar URL (which Pulsar ignores and its
/// client would print at ERROR on every reconnect) are refused before any connection,
/// whatever characters they hold, and neither the error nor any log line shows them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_inside_the_url_are_refused_and_never_printed() {
    capture_logs("trace");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let address = listener.local_addr().expect("address").to_string();
    let mut secrets = vec!["eyJhbGciOiJIUzI1NiJ9.tok-7e21ab".to_owned()];
    secrets.extend(ruststream_test_support::HOSTILE_PASSWORDS.map(|p| format!("billing:{p}")));
    for secret in &secrets {
        for scheme in ["pulsar", "pulsar+ssl"] {
            let url = format!("{scheme}://{secret}@{address}");
            let error = Pulsar::connect_within(&url, Duration::from_secs(3))
                .await
                .expect_err("credentials in the URL are refused");
            let shown = format!("{error} {error:?}");
            assert!(shown.contains(&address), "{shown}");
            assert!(shown.contains("Security::token"), "{shown}");
            let password = secret.trim_start_matches("billing:");
            ruststream_test_support::assert_shows_no_part_of(&shown, password);
            let waiting = Pulsar::connect_waiting(&url, Duration::from_millis(200));
            tokio::time::timeout(Duration::from_secs(2), waiting)
                .await
                .expect("not waited out")
                .expect_err("refused");
        }
    }
    let nobody = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
    assert!(nobody.is_err(), "nothing connected");
    for secret in &secrets {
        ruststream_test_support::assert_no_log_line_holds_part_of(
            secret.trim_start_matches("billing:"),
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_from_the_environment_reach_the_client() {
    use ruststream_core::{Env, EnvError, FromEnvError};
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let address = listener.local_addr().expect("address").to_string();
    let seen = tokio::spawn(first_frame(listener));
    let url = format!("pulsar://{address}");
    let env = Env::from_pairs(
        "ORDERS_PULSAR",
        [
            ("ORDERS_PULSAR_URL", url.as_str()),
            ("ORDERS_PULSAR_TOKEN", TOKEN),
        ],
    );
    let error = Pulsar::connect_from_env(&env)
        .await
        .expect_err("the listener answers no CONNECT");
    assert!(matches!(error, FromEnvError::Connect(_)), "{error:?}");
    assert!(
        holds(&seen.await.expect("joined"), TOKEN),
        "no token in CONNECT"
    );

    let missing = Pulsar::connect_from_env(&Env::from_pairs(
        "ORDERS_PULSAR",
        [("ORDERS_PULSAR_TOKEN", TOKEN)],
    ))
    .await;
    let Err(FromEnvError::Env(EnvError::Missing { variable })) = missing else {
        panic!("no URL is refused");
    };
    assert_eq!(variable, "ORDERS_PULSAR_URL");
}
