//! Credentials in a RabbitMQ URL never printed, whatever characters the password holds.

use std::time::Duration;

use ruststream_rabbitmq::RabbitMq;
use tokio::net::TcpListener;

/// Issue #46, item 1: a password holding `/`, `,`, `#`, `?` or `@` is masked whole in the
/// connect error (Display and Debug) and in every log line, refused by the real broker
/// (wrong credentials) or by an address that closes every connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_with_url_delimiters_is_never_printed() {
    ruststream_test_support::capture_logs("trace");
    let url = std::env::var("RUSTSTREAM_RABBITMQ_URL").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_RABBITMQ_URL is not set: run the tests with scripts/test, which starts rabbitmq-server")
    });
    let (_, _, rest) = ruststream_core::split_userinfo(&url).expect("the test URL has user-info");
    let broker = rest[1..].split('/').next().expect("host:port").to_owned();
    let closing = TcpListener::bind("127.0.0.1:0").await.expect("listen");
    let closed = closing.local_addr().expect("address").to_string();
    ruststream_test_support::close_every_connection(closing);
    for password in ruststream_test_support::HOSTILE_PASSWORDS {
        for address in [&broker, &closed] {
            let url = format!("amqp://billing:{password}@{address}/%2f");
            let error = RabbitMq::connect_within(&url, Duration::from_secs(5))
                .await
                .expect_err("refused");
            let shown = format!("{error} {error:?}");
            ruststream_test_support::assert_shows_no_part_of(&shown, password);
            assert!(shown.contains("amqp://***@"), "{shown}");
        }
        ruststream_test_support::assert_no_log_line_holds_part_of(password);
    }
}
