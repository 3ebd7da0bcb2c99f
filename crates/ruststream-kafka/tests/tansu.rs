//! Where tansu, the Kafka-API broker the test command starts, differs from Apache Kafka in
//! a way our tests and docs account for. Each test pins one difference against the running
//! broker: when a tansu update removes it, the test fails, and the exception it names can
//! go. The test command leaves these out when `RUSTSTREAM_REAL_KAFKA_BROKERS` names a real
//! Kafka.
//!
//! - **A transaction that produced nothing commits its offsets only if it is its
//!   producer's first.** tansu (0.6.0) applies the offsets a transaction sent with
//!   `send_offsets_to_transaction` at `commit_transaction` when the transaction produced
//!   records, or when it is the first its producer ran; a later transaction that only
//!   commits offsets reports success and leaves the group's offsets where they were (the
//!   next transaction that produces replaces them). Kafka commits them every time. Under
//!   `Commit::Transactional`, a window whose handlers produced nothing is such a
//!   transaction: on tansu, a restarted service reads those records again (at least once,
//!   as a window's side effects other than produced records always are); its outputs stay
//!   exactly-once. This is why the fault suite's exactly-once service produces an output
//!   per message (`e3_kafka_transactional_sigterm_during_a_backlog_settles_what_finished`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{blocking, brokers, committed, create_topic, kafka, unique};
use ruststream_kafka::rdkafka::consumer::{BaseConsumer, Consumer};
use ruststream_kafka::rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use ruststream_kafka::rdkafka::{ClientConfig, Offset, TopicPartitionList};

const WAIT: Duration = Duration::from_secs(10);

/// One transaction of `producer`: optionally one record to `output`, and `offset` as the
/// group's next offset of `input`, committed together.
fn transaction(
    producer: &BaseProducer,
    consumer: &BaseConsumer,
    input: &str,
    output: Option<&str>,
    offset: i64,
) {
    producer.begin_transaction().expect("begin");
    if let Some(output) = output {
        producer
            .send(BaseRecord::<(), [u8]>::to(output).payload(b"out"))
            .map_err(|(e, _)| e)
            .expect("produce");
    }
    let mut list = TopicPartitionList::new();
    list.add_partition_offset(input, 0, Offset::Offset(offset))
        .expect("offset");
    let group = consumer.group_metadata().expect("group metadata");
    producer
        .send_offsets_to_transaction(&list, &group, WAIT)
        .expect("offsets join the transaction");
    producer.commit_transaction(WAIT).expect("commit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_an_output_less_transaction_after_the_first_commits_no_offsets() {
    let _ = kafka().await;
    let (input, output, group) = (unique("tansu-in"), unique("tansu-out"), unique("g"));
    create_topic(&input, 1).await;
    create_topic(&output, 1).await;
    let (brokers, id, of_group) = (brokers(), unique("tansu-tx"), group.clone());
    let clients = Arc::new(
        blocking(move || {
            let producer: BaseProducer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("transactional.id", &id)
                .create()
                .expect("producer");
            producer.init_transactions(WAIT).expect("init transactions");
            // Only for the group's metadata, which the offsets are sent with.
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &of_group)
                .set("enable.auto.commit", "false")
                .create()
                .expect("consumer");
            (producer, consumer)
        })
        .await,
    );
    let mut steps = Vec::new();
    for (produce, offset) in [(false, 10), (false, 20), (true, 30), (false, 40)] {
        let (clients, to_input, output) = (Arc::clone(&clients), input.clone(), output.clone());
        blocking(move || {
            let to = produce.then_some(output.as_str());
            transaction(&clients.0, &clients.1, &to_input, to, offset);
        })
        .await;
        steps.push((produce, offset, committed(&group, &input, 0).await));
    }
    // Dropping rdkafka clients can block (see brokers.md).
    std::mem::forget(clients);
    assert_eq!(
        steps,
        vec![
            (false, 10, Some(10)),
            // The difference: Kafka has 20 committed here.
            (false, 20, Some(10)),
            (true, 30, Some(30)),
            (false, 40, Some(30)),
        ],
        "(produced a record, offset sent, the group's committed offset after the commit)"
    );
}
