//! What the RabbitMQ tests share: the broker the test command started, queues declared.
#![allow(dead_code, unreachable_pub)]

use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use ruststream_rabbitmq::{RabbitMq, lapin};

/// The broker the test command started; a missing one fails the test.
pub async fn rabbit() -> RabbitMq {
    ruststream_test_support::capture_logs("debug,lapin=info");
    let url = std::env::var("RUSTSTREAM_RABBITMQ_URL").unwrap_or_else(|_| {
        panic!("RUSTSTREAM_RABBITMQ_URL is not set: run the tests with scripts/test, which starts rabbitmq-server")
    });
    RabbitMq::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the RabbitMQ tests need rabbitmq-server: {e}"))
}

pub fn text(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// Declares a durable queue named `name` with `arguments`.
pub async fn declare(rabbit: &RabbitMq, name: &str, arguments: &[(&str, AMQPValue)]) {
    let channel = rabbit.connection().create_channel().await.expect("channel");
    let mut table = FieldTable::default();
    for (key, value) in arguments {
        table.insert(ShortString::from(*key), value.clone());
    }
    channel
        .queue_declare(
            ShortString::from(name),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            table,
        )
        .await
        .expect("declare");
    let _ = channel.close(200, ShortString::from("done")).await;
}
