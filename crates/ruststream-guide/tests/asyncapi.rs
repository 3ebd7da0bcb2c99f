//! The AsyncAPI document of a service on every broker: one server per connection (no
//! credentials), the broker bindings AsyncAPI defines, retry addresses where the runtime
//! publishes retry copies; validated by the AsyncAPI project's own parser.

use std::time::Duration;

use ruststream::asyncapi::Sends;
use ruststream::{App, HandlerOutcome, Message, on};
use ruststream_core::Env;
use ruststream_kafka::{Commit, Kafka};
use ruststream_nats::Nats;
use ruststream_pulsar::Pulsar;
use ruststream_rabbitmq::RabbitMq;
use ruststream_redis::Redis;
use ruststream_test_support::asyncapi::validate;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Payment {
    order: u64,
    cents: i64,
    card: Option<Card>,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Card {
    last4: String,
}

async fn pay(Message(_p): Message<Payment>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

async fn service() -> App {
    let nats = Nats::connect_from_env(&Env::new("RUSTSTREAM_NATS"))
        .await
        .expect("NATS");
    let kafka = Kafka::from_env(&Env::new("RUSTSTREAM_KAFKA")).expect("Kafka");
    let pulsar_url = format!(
        "pulsar://{}",
        std::env::var("RUSTSTREAM_PULSAR_ADDR").expect("RUSTSTREAM_PULSAR_ADDR")
    );
    let pulsar = Pulsar::connect(&pulsar_url).await.expect("Pulsar");
    let rabbit = RabbitMq::connect_from_env(&Env::new("RUSTSTREAM_RABBITMQ"))
        .await
        .expect("RabbitMQ");
    let redis = Redis::connect_from_env(&Env::new("RUSTSTREAM_REDIS"))
        .await
        .expect("Redis");
    App::new()
        .info("payments", "0.3.0")
        .register(
            on(
                kafka
                    .topic("payments")
                    .group("billing")
                    .commit(Commit::Tracked)
                    .set("client.id", "payments-1"),
                pay,
            )
            .name("kafka-pay")
            .schema::<Payment>()
            .max_attempts(3)
            .dead_letter("payments.dead"),
        )
        .register(
            on(nats.consumer("PAYMENTS", "billing"), pay)
                .name("jetstream-pay")
                .schema::<Payment>()
                .max_attempts(3)
                .dead_letter("payments.js.dead"),
        )
        .register(on(nats.subject("payments.core").queue_group("billing"), pay).name("core-pay"))
        .register(
            on(
                pulsar
                    .topic("persistent://public/default/payments")
                    .subscription("billing"),
                pay,
            )
            .name("pulsar-pay")
            .schema::<Payment>(),
        )
        .register(
            on(rabbit.queue("payments"), pay)
                .name("rabbit-pay")
                .schema::<Payment>()
                .max_attempts(3)
                .dead_letter("payments.rabbit.dead")
                .timeout(Duration::from_secs(5)),
        )
        .register(
            on(redis.stream("payments", "billing"), pay)
                .name("redis-pay")
                .max_attempts(3)
                .dead_letter("payments.redis.dead"),
        )
        .sends(
            Sends::to(
                &ruststream::Publisher::new(kafka.publish_handle()),
                "receipts",
            )
            .schema::<Card>(),
        )
}

#[tokio::test]
async fn the_document_of_a_service_on_every_broker_validates() {
    let document = service().await.asyncapi();
    for (text, extension) in [(document.json(), "json"), (document.yaml(), "yaml")] {
        let validated = validate(&text, extension);
        assert!(
            validated.clean,
            "{extension}:\n{}\n{text}",
            validated.report
        );
    }
}

#[tokio::test]
async fn servers_bindings_and_retry_addresses_are_described() {
    let document = service().await.asyncapi();
    let doc = document.value();
    let protocols: Vec<&str> = doc["servers"]
        .as_object()
        .unwrap()
        .values()
        .map(|s| s["protocol"].as_str().unwrap())
        .collect();
    for protocol in ["kafka", "nats", "pulsar", "amqp", "redis"] {
        assert!(
            protocols.contains(&protocol),
            "{protocol}: {}",
            doc["servers"]
        );
    }
    let text = document.json();
    assert!(
        !text.contains("guest"),
        "credentials in the document: {}",
        doc["servers"]
    );
    let op = |id: &str| doc["operations"][id].clone();
    let kafka = &op("kafka-pay.receive")["bindings"]["kafka"];
    assert_eq!(kafka["groupId"]["enum"][0], "billing");
    assert_eq!(kafka["clientId"]["enum"][0], "payments-1");
    assert_eq!(op("kafka-pay.receive")["x-ruststream-commit"], "tracked");
    assert_eq!(
        op("core-pay.receive")["bindings"]["nats"]["queue"],
        "billing"
    );
    let rabbit_channel = op("rabbit-pay.receive")["channel"]["$ref"]
        .as_str()
        .unwrap()
        .trim_start_matches("#/channels/")
        .to_owned();
    assert_eq!(
        doc["channels"][&rabbit_channel]["bindings"]["amqp"]["queue"]["name"],
        "payments"
    );
    assert_eq!(op("rabbit-pay.receive")["x-ruststream-timeout-ms"], 5000);
    // Retry copies: Kafka (retry_after has no native form) and RabbitMQ classic (counts
    // nothing) publish them to the address they read; JetStream redelivers natively.
    assert_eq!(op("kafka-pay.retry")["action"], "send");
    assert_eq!(op("rabbit-pay.retry")["action"], "send");
    assert_eq!(op("jetstream-pay.retry"), Value::Null);
    for id in ["kafka-pay", "jetstream-pay", "rabbit-pay", "redis-pay"] {
        assert_eq!(op(&format!("{id}.dead-letter"))["action"], "send", "{id}");
    }
    assert_eq!(
        op("redis-pay.dead-letter")["x-ruststream-written-by"],
        "subscription"
    );
    assert_eq!(op("send.receipts")["action"], "send");
    // Kafka, RabbitMQ and Redis each read an address named `payments`: three channels,
    // each on its own server.
    let mut servers: Vec<String> = ["kafka-pay", "rabbit-pay", "redis-pay"]
        .iter()
        .map(|id| {
            let channel = op(&format!("{id}.receive"))["channel"]["$ref"]
                .as_str()
                .unwrap()
                .trim_start_matches("#/channels/")
                .to_owned();
            assert_eq!(doc["channels"][&channel]["address"], "payments", "{id}");
            doc["channels"][&channel]["servers"][0]["$ref"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    servers.dedup();
    assert_eq!(
        servers,
        ["#/servers/kafka", "#/servers/amqp", "#/servers/redis"]
    );
}
