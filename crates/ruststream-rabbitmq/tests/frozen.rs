//! A rabbitmq-server of the test's own that stops answering (SIGSTOP) under a publisher:
//! a publish waiting for its confirm fails once the connection's heartbeat is missed
//! (`heartbeat` in the URL), and the publishes of a `send_all` waiting to open a channel
//! then share one failed connect instead of each waiting out a connect timeout in turn.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ruststream::Publisher;
use ruststream::core::{Outgoing, PublishErrorKind};
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_test_support::rabbit_broker::OwnRabbit;
use ruststream_test_support::unique_suffix;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_to_a_broker_that_stopped_answering_fail_within_bounds() {
    let broker = OwnRabbit::new();
    broker.start().await;
    // Missed heartbeats are seen after two intervals: 2 s here, 120 s at the default.
    let url = format!("{}?heartbeat=1", broker.url());
    let connect = Duration::from_secs(3);
    let rabbit = RabbitMq::connect_within(&url, connect)
        .await
        .expect("connect");
    let queue = format!("frozen-{}", unique_suffix());
    rabbit
        .declare_queue(&queue, QueueKind::Classic)
        .await
        .expect("declared");
    let publisher = Publisher::new(rabbit.publish_handle());
    let to: Arc<str> = Arc::from(queue.as_str());
    publisher
        .publish(Outgoing::new(Arc::clone(&to), "warm"))
        .await
        .expect("confirmed while the broker answers");

    broker.freeze();
    let started = Instant::now();
    let one = publisher
        .publish(Outgoing::new(Arc::clone(&to), "one"))
        .await;
    let one_took = started.elapsed();
    let started = Instant::now();
    let many = publisher
        .send_all((0..20).map(|n| Outgoing::new(Arc::clone(&to), n.to_string())))
        .await;
    let many_took = started.elapsed();
    broker.thaw();

    let error = one.expect_err("no confirm from a frozen broker");
    assert_eq!(error.kind(), PublishErrorKind::Disconnected, "{error}");
    assert!(one_took < Duration::from_secs(20), "took {one_took:?}");
    assert_eq!(many.len(), 20);
    for (i, result) in many.iter().enumerate() {
        let error = result.as_ref().expect_err("no channel to a frozen broker");
        assert_eq!(
            error.kind(),
            PublishErrorKind::Disconnected,
            "message {i}: {error}"
        );
        assert_eq!(error.address(), queue, "message {i}");
    }
    // One connect timeout (3 s) for the call, not one per message (60 s).
    assert!(many_took < Duration::from_secs(15), "took {many_took:?}");
}
