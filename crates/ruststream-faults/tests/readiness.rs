//! Readiness follows the broker (issue #14): ready after start, not ready while the
//! broker is away, ready again once it is back. NATS runs a server of this test's own,
//! killed and started again on its port; Kafka runs librdkafka's mock cluster, whose one
//! broker is taken down and brought up; Redis runs a server of the test's own, like NATS.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ruststream::{App, HandlerOutcome, Message, on};
use ruststream_faults::{free_port, installed, unique};
use ruststream_kafka::Kafka;
use ruststream_kafka::rdkafka::mocking::MockCluster;
use ruststream_nats::Nats;
use ruststream_test_support::ops::get;

async fn ack(Message(_): Message<String>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

/// Polls `/health/ready` until its status is `want`; returns the body.
async fn ready_becomes(running: &ruststream::Running, want: u16, within: Duration) -> String {
    let addr = running.ops_addr().expect("ops endpoint on");
    let deadline = Instant::now() + within;
    loop {
        let (status, body) = get(addr, "/health/ready").await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/health/ready stayed {status} ({body:?}), expected {want} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn nats_server(port: u16) -> Child {
    let child = Command::new(installed("nats-server"))
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nats-server");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nats-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_ready_follows_the_nats_connection() {
    let port = free_port();
    let mut server = nats_server(port);
    let nats = Nats::connect(&format!("nats://127.0.0.1:{port}"))
        .await
        .expect("connect");
    let running = App::new()
        .ops(0)
        .register(on(nats.subject(unique("ready")), ack).name("core"))
        .start()
        .await
        .expect("start");
    ready_becomes(&running, 200, Duration::from_secs(5)).await;
    server.kill().expect("kill nats-server");
    server.wait().expect("reaped");
    let body = ready_becomes(&running, 503, Duration::from_secs(10)).await;
    assert!(
        body.contains("registration `core`") && body.contains("connection to the broker is down"),
        "{body}"
    );
    let mut server = nats_server(port);
    ready_becomes(&running, 200, Duration::from_secs(20)).await;
    running.stop().await;
    server.kill().expect("kill nats-server");
    let _ = server.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_ready_follows_the_kafka_cluster() {
    let cluster = MockCluster::new(1).expect("mock cluster");
    let topic = unique("ready");
    cluster.create_topic(&topic, 1, 1).expect("topic");
    let kafka = Kafka::connect(&cluster.bootstrap_servers()).expect("client");
    let running = App::new()
        .ops(0)
        .register(
            on(
                kafka
                    .topic(&topic)
                    .group(unique("g"))
                    .set("session.timeout.ms", "6000"),
                ack,
            )
            .name("kafka"),
        )
        .start()
        .await
        .expect("start");
    ready_becomes(&running, 200, Duration::from_secs(10)).await;
    cluster.broker_down(1).expect("broker down");
    let body = ready_becomes(&running, 503, Duration::from_secs(20)).await;
    assert!(body.contains("registration `kafka`"), "{body}");
    cluster.broker_up(1).expect("broker up");
    ready_becomes(&running, 200, Duration::from_secs(20)).await;
    running.stop().await;
}

fn redis_server(port: u16) -> Child {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server (installed by the test command)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// S8: readiness follows the reads of the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s8_ops_ready_follows_the_redis_server() {
    let port = free_port();
    let mut server = redis_server(port);
    let redis = ruststream_redis::Redis::connect(&format!("redis://127.0.0.1:{port}"))
        .await
        .expect("connect");
    let running = App::new()
        .ops(0)
        .register(on(redis.stream(unique("ready"), "g"), ack).name("redis"))
        .start()
        .await
        .expect("start");
    ready_becomes(&running, 200, Duration::from_secs(5)).await;
    server.kill().expect("kill redis-server");
    server.wait().expect("reaped");
    let body = ready_becomes(&running, 503, Duration::from_secs(10)).await;
    assert!(body.contains("registration `redis`"), "{body}");
    let mut server = redis_server(port);
    ready_becomes(&running, 200, Duration::from_secs(20)).await;
    running.stop().await;
    server.kill().expect("kill redis-server");
    let _ = server.wait();
}

fn pulsar_lite(port: u16, data: &std::path::Path) -> Child {
    let config = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../.brokers/pulsar-lite.toml");
    let child = Command::new(installed("pulsar-lite"))
        .arg("--config")
        .arg(&config)
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .arg("--db-path")
        .arg(data)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pulsar-lite (installed by the test command)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "pulsar-lite did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Issue #46: the "not ready" alert on Pulsar: readiness follows a pulsar-lite of this
/// test's own (through the checksum relay the Pulsar tests use), killed and started
/// again on its port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ops_ready_follows_the_pulsar_broker() {
    let port = free_port();
    let data = std::env::temp_dir().join(unique("pulsar-ready"));
    let mut broker = pulsar_lite(port, &data);
    let relay = ruststream_test_support::pulsar_relay::start(format!("127.0.0.1:{port}")).await;
    let pulsar = ruststream_pulsar::Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("connect through the relay");
    let running = App::new()
        .ops(0)
        .register(on(pulsar.topic(unique("ready")).subscription("ready"), ack).name("pulsar"))
        .start()
        .await
        .expect("start");
    ready_becomes(&running, 200, Duration::from_secs(10)).await;
    broker.kill().expect("kill pulsar-lite");
    broker.wait().expect("reaped");
    let body = ready_becomes(&running, 503, Duration::from_secs(30)).await;
    assert!(body.contains("registration `pulsar`"), "{body}");
    let mut broker = pulsar_lite(port, &data);
    ready_becomes(&running, 200, Duration::from_secs(60)).await;
    running.stop().await;
    broker.kill().expect("kill pulsar-lite");
    let _ = broker.wait();
    let _ = std::fs::remove_dir_all(&data);
}
