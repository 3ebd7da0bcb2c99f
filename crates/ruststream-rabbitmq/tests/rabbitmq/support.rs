//! Helpers shared by the modules of this test binary: sending to a queue and taking
//! messages off it directly.

use std::time::Duration;

use lapin::options::BasicGetOptions;
use lapin::types::ShortString;
use ruststream::Headers;
use ruststream_rabbitmq::{RabbitMq, lapin};

/// Takes one message off `queue`, if there is one.
pub(crate) async fn get(rabbit: &RabbitMq, queue: &str) -> Option<lapin::message::Delivery> {
    let channel = rabbit.connection().create_channel().await.expect("channel");
    let message = channel
        .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
        .map(|m| m.delivery);
    let _ = channel.close(200, ShortString::from("done")).await;
    message
}

/// Takes one message off `queue`, waiting up to 10 s for one to arrive.
pub(crate) async fn arrives(rabbit: &RabbitMq, queue: &str) -> Option<lapin::message::Delivery> {
    for _ in 0..200 {
        if let Some(message) = get(rabbit, queue).await {
            return Some(message);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

pub(crate) async fn send(rabbit: &RabbitMq, queue: &str, payload: &[u8]) {
    rabbit
        .publisher()
        .send(queue, &Headers::new(), payload)
        .await
        .expect("published");
}
