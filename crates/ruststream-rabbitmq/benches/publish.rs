//! `send_all` of many messages next to the raw client's own pipelined publish (a
//! confirming channel: every `basic.publish` sent, the confirms awaited together), rate
//! compared, in alternating rounds. Needs rabbitmq-server at `RUSTSTREAM_RABBITMQ_URL`.
//!
//! Run with `cargo bench -p ruststream-rabbitmq --bench publish`.

use ruststream::Publisher;
use ruststream::core::Outgoing;
use ruststream_rabbitmq::lapin::BasicProperties;
use ruststream_rabbitmq::lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeleteOptions,
};
use ruststream_rabbitmq::lapin::types::ShortString;
use ruststream_rabbitmq::{QueueKind, RabbitMq};
use ruststream_test_support::bench::{PAYLOAD, env_count};
use ruststream_test_support::publish_bench::compare;

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_RABBITMQ_URL")
        .expect("RUSTSTREAM_RABBITMQ_URL: run scripts/test or start a broker");
    let rabbit = RabbitMq::connect(&url).await.expect("rabbitmq");
    let n = env_count("BENCH_MESSAGES", 100_000);
    let rounds = env_count("BENCH_ROUNDS", 3);
    let mut queues = Vec::new();
    for side in ["raw", "send-all"] {
        for round in 0..rounds {
            let queue = format!("bench-publish-{side}-{round}-{}", std::process::id());
            rabbit
                .declare_queue(&queue, QueueKind::Classic)
                .await
                .expect("queue");
            queues.push(queue);
        }
    }
    let queue = |side: usize, round: usize| queues[side * rounds + round].clone();
    let raw = |round: usize| {
        let (rabbit, queue) = (rabbit.clone(), queue(0, round));
        async move {
            let channel = rabbit.connection().create_channel().await.expect("channel");
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .expect("confirms");
            let mut confirms = Vec::with_capacity(n);
            for _ in 0..n {
                let confirm = channel
                    .basic_publish(
                        ShortString::from(""),
                        ShortString::from(queue.as_str()),
                        BasicPublishOptions::default(),
                        PAYLOAD,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .expect("published");
                confirms.push(confirm);
            }
            for confirm in confirms {
                assert!(confirm.await.expect("confirmed").is_ack());
            }
        }
    };
    let publisher = Publisher::new(rabbit.publish_handle());
    let framework = |round: usize| {
        let (publisher, queue) = (publisher.clone(), queue(1, round));
        async move {
            // One shared address for all, as a caller sending many to one place makes it.
            let address: std::sync::Arc<str> = std::sync::Arc::from(queue.as_str());
            let messages =
                (0..n).map(move |_| Outgoing::new(std::sync::Arc::clone(&address), PAYLOAD));
            let results = publisher.send_all(messages).await;
            assert!(results.iter().all(Result::is_ok), "every message confirmed");
        }
    };
    compare("rabbitmq/publish", n, rounds, raw, framework).await;
    // Persistent messages left behind would fill the broker's disk run after run.
    let channel = rabbit.connection().create_channel().await.expect("channel");
    for queue in &queues {
        channel
            .queue_delete(
                ShortString::from(queue.as_str()),
                QueueDeleteOptions::default(),
            )
            .await
            .expect("queue deleted");
    }
}
