//! What consuming costs through ruststream (classic queue, ack) next to the raw `lapin`
//! loop (next, decode, `basic.ack`) on the same messages, in one run: CPU time of the
//! consuming thread per message, and the rate (see `ruststream_test_support::bench`).
//! Needs rabbitmq-server at `RUSTSTREAM_RABBITMQ_URL` (scripts/test starts it).
//!
//! Run with `cargo bench -p ruststream-rabbitmq --bench consume`.

use std::sync::LazyLock;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use ruststream::Headers;
use ruststream_rabbitmq::{DEFAULT_PREFETCH, QueueKind, RabbitMq, lapin};
use ruststream_test_support::bench::{
    BrokerCpu, Figures, PAYLOAD, Side, Span, Tick, env_count, in_turn, load_average, own_thread,
    report, through_app, with_broker_cpu,
};

/// Messages per side and rounds; `BENCH_MESSAGES` and `BENCH_ROUNDS` change them (a
/// callgrind run wants fewer: `scripts/bench-callgrind-transport`).
static MESSAGES: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_MESSAGES", 20_000));
static ROUNDS: LazyLock<usize> = LazyLock::new(|| env_count("BENCH_ROUNDS", 3));
const LIMIT: Duration = Duration::from_secs(300);

async fn fill(rabbit: &RabbitMq, queue: &str) {
    rabbit
        .declare_queue(queue, QueueKind::Classic)
        .await
        .expect("declared");
    let publisher = rabbit.publisher();
    for _ in 0..*MESSAGES {
        publisher
            .send(queue, &Headers::new(), PAYLOAD)
            .await
            .expect("sent");
    }
}

/// The loop a user would write: next, decode, ack, with the same prefetch.
async fn raw(rabbit: RabbitMq, queue: String) -> Figures {
    own_thread(Side::Raw, move || async move {
        let channel = rabbit.connection().create_channel().await.expect("channel");
        channel
            .basic_qos(DEFAULT_PREFETCH, BasicQosOptions::default())
            .await
            .expect("qos");
        let mut consumer = channel
            .basic_consume(
                ShortString::from(queue.as_str()),
                ShortString::from("raw"),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("consumer");
        let span = Span::new(*MESSAGES);
        for _ in 0..*MESSAGES {
            let delivery = consumer.next().await.expect("open").expect("delivery");
            let tick: Tick = serde_json::from_slice(&delivery.data).expect("decodes");
            std::hint::black_box(tick);
            channel
                .basic_ack(delivery.delivery_tag, BasicAckOptions::default())
                .await
                .expect("ack");
            Span::hit(&span);
        }
        let figures = Span::figures(&span);
        let _ = channel.close(200, ShortString::from("done")).await;
        figures
    })
    .await
}

async fn framework(rabbit: RabbitMq, queue: String) -> Figures {
    through_app(*MESSAGES, LIMIT, move || rabbit.queue(queue)).await
}

#[tokio::main]
async fn main() {
    let url = std::env::var("RUSTSTREAM_RABBITMQ_URL")
        .expect("RUSTSTREAM_RABBITMQ_URL: run scripts/test or start rabbitmq-server");
    let rabbit = RabbitMq::connect(&url).await.expect("connect");
    let load = load_average();
    // What the broker's process spends per message while each side reads (ticks of 10 ms).
    let broker = BrokerCpu::listening_at(&url);
    let mut brokers = Vec::new();
    let (mut raws, mut frameworks) = (Vec::new(), Vec::new());
    for round in 0..*ROUNDS {
        let (raw_queue, framework_queue) = (
            format!("bench-raw-{}-{round}", std::process::id()),
            format!("bench-framework-{}-{round}", std::process::id()),
        );
        fill(&rabbit, &raw_queue).await;
        fill(&rabbit, &framework_queue).await;
        let ((r, raw_broker), (f, framework_broker)) = in_turn(
            round,
            || with_broker_cpu(&broker, *MESSAGES, raw(rabbit.clone(), raw_queue)),
            || {
                with_broker_cpu(
                    &broker,
                    *MESSAGES,
                    framework(rabbit.clone(), framework_queue),
                )
            },
        )
        .await;
        raws.push(r);
        frameworks.push(f);
        brokers.push((raw_broker, framework_broker));
    }
    println!(
        "{}",
        report(
            &format!(
                "rabbitmq/consume (classic queue, ack, {} messages)",
                *MESSAGES
            ),
            &raws,
            &frameworks,
            &format!("{load} at start, {} at end", load_average())
        )
    );
    let rounds: Vec<String> = brokers
        .iter()
        .map(|(r, f)| format!("{:.1}/{:.1}", r / 1e3, f / 1e3))
        .collect();
    println!(
        "rabbitmq/consume broker CPU per message, raw/ruststream us by round: {}",
        rounds.join(" ")
    );
}
