//! G7: connecting: a wrong password or a closed port fails at once, naming the address,
//! never the password.

use std::time::Duration;

use ruststream_rabbitmq::RabbitMq;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_once_naming_the_address_never_the_password() {
    ruststream_test_support::capture_logs("trace");
    let url = std::env::var("RUSTSTREAM_RABBITMQ_URL").expect("RUSTSTREAM_RABBITMQ_URL");
    let wrong = "pw-wrong-6d1f3e";
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let bad = format!("{scheme}://guest:{wrong}@{host}");
    let started = std::time::Instant::now();
    let error = RabbitMq::connect(&bad)
        .await
        .expect_err("the broker refuses the password");
    assert!(started.elapsed() < Duration::from_secs(5), "failed at once");
    let shown = format!("{error} {error:?}");
    let address = host.split('/').next().expect("host:port");
    assert!(shown.contains(address), "{shown}");
    assert!(shown.contains("amqp://***@"), "masked: {shown}");
    assert!(!shown.contains(wrong), "{shown}");
    ruststream_test_support::assert_no_log_line_holds(wrong);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g7_start_against_a_closed_port_fails_within_the_timeout_naming_it() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let url = format!("amqp://guest:s3cret@127.0.0.1:{port}/%2f");
    let started = std::time::Instant::now();
    let error = RabbitMq::connect_within(&url, Duration::from_secs(2))
        .await
        .expect_err("nothing listens there");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let shown = format!("{error} {error:?}");
    assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
    assert!(!shown.contains("s3cret"), "{shown}");
}
