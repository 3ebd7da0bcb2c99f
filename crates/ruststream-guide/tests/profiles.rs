//! Each simulation profile (`ruststream::testing::sim::Profile`) poses as its
//! transport: the capabilities the simulated broker's topics report are the ones the
//! transport's descriptors report (Kafka `Commit::Tracked`, a classic RabbitMQ queue, a
//! Pulsar `Shared` subscription without an ack timeout), so the runtime plans each
//! outcome in a simulation as it would on that broker. The two stated exceptions: Redis
//! and Pulsar dead letters are published by the runtime in a simulation.

use ruststream::testing::sim::Profile;
use ruststream_core::{Capabilities, DeadLetters, Descriptor, Env};
use ruststream_kafka::TRACKED_CAPABILITIES;
use ruststream_nats::{JETSTREAM_CAPABILITIES, Nats};
use ruststream_pulsar::Pulsar;
use ruststream_rabbitmq::RabbitMq;
use ruststream_redis::Redis;

/// `capabilities` with the runtime publishing dead letters, as the memory broker needs.
fn runtime_dead_letters(capabilities: Capabilities) -> Capabilities {
    capabilities.with_dead_letters(DeadLetters::Runtime)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_profile_reports_its_transports_capabilities() {
    assert_eq!(Profile::Kafka.capabilities(), TRACKED_CAPABILITIES);
    assert_eq!(Profile::JetStream.capabilities(), JETSTREAM_CAPABILITIES);
    let nats = Nats::connect_from_env(&Env::new("RUSTSTREAM_NATS"))
        .await
        .expect("NATS");
    assert_eq!(
        Profile::CoreNats.capabilities(),
        nats.subject("orders").capabilities()
    );
    let rabbit = RabbitMq::connect_from_env(&Env::new("RUSTSTREAM_RABBITMQ"))
        .await
        .expect("RabbitMQ");
    assert_eq!(
        Profile::RabbitMq.capabilities(),
        rabbit.queue("orders").capabilities()
    );
    let redis = Redis::connect_from_env(&Env::new("RUSTSTREAM_REDIS"))
        .await
        .expect("Redis");
    assert_eq!(
        Profile::Redis.capabilities(),
        runtime_dead_letters(redis.stream("orders", "service").capabilities())
    );
    let broker = std::env::var("RUSTSTREAM_PULSAR_ADDR").expect("RUSTSTREAM_PULSAR_ADDR");
    let relay = ruststream_test_support::pulsar_relay::start(broker).await;
    let pulsar = Pulsar::connect(&format!("pulsar://{relay}"))
        .await
        .expect("Pulsar");
    assert_eq!(
        Profile::Pulsar.capabilities(),
        runtime_dead_letters(
            pulsar
                .topic("orders")
                .subscription("service")
                .capabilities()
        )
    );
}
