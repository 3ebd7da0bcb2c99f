//! TLS on Pulsar. pulsar-lite, the broker the test command runs, takes no TLS and no
//! authentication, so this checks that `pulsar+ssl://` reaches the client: its first
//! bytes on a listener of the test's own are a TLS ClientHello, and the failed connection
//! is an error naming the address with its credentials masked.

use std::time::Duration;

use ruststream_pulsar::Pulsar;
use ruststream_test_support::assert_tls_client_hello;
use tokio::net::TcpListener;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulsar_ssl_opens_with_a_tls_handshake_and_the_error_masks_the_token() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let address = listener.local_addr().expect("address").to_string();
    let token = "tok-0c55e1";
    let url = format!("pulsar+ssl://{token}@{address}");
    let connecting =
        tokio::spawn(async move { Pulsar::connect_within(&url, Duration::from_secs(3)).await });
    assert_tls_client_hello(&listener).await;
    let error = connecting
        .await
        .expect("joined")
        .expect_err("no Pulsar broker answers");
    let shown = format!("{error} {error:?}");
    assert!(shown.contains(&address), "{shown}");
    assert!(!shown.contains(token), "{shown}");
}
