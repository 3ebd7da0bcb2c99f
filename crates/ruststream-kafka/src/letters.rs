//! A dead-letter topic read back: a consumer of the group `ruststream-dead-letters`
//! assigned every partition at that group's committed offsets (no group join), and a
//! replayed record "removed" by committing past it. A topic cannot delete one record, so
//! removal is in order: a replay cannot skip a record and remove a later one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Message, Offset, TopicPartitionList};
use ruststream_core::{BoxFuture, Letter, LetterBox};

use crate::Kafka;
use crate::context::KafkaContext;

/// The consumer group whose committed offsets say which dead letters were replayed.
pub const DEAD_LETTER_GROUP: &str = "ruststream-dead-letters";

/// How long a read waits for the next record before taking the topic as read.
const IDLE: Duration = Duration::from_secs(3);

/// The dead letters in one topic.
pub(crate) struct KafkaLetters {
    consumer: Arc<BaseConsumer<KafkaContext>>,
    topic: String,
}

impl KafkaLetters {
    /// A reader of `topic`, assigned every partition at the group's committed offsets.
    pub(crate) async fn open(kafka: &Kafka, topic: &str) -> Result<Self, String> {
        let mut config = kafka.client_config();
        config
            .set("group.id", DEAD_LETTER_GROUP)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "true");
        let consumer: BaseConsumer<KafkaContext> = config
            .create_with_context(kafka.context())
            .map_err(|e| format!("a Kafka reader for `{topic}`: {e}"))?;
        let consumer = Arc::new(consumer);
        let (reader, name) = (Arc::clone(&consumer), topic.to_owned());
        let timeout = kafka.connect_timeout_value();
        tokio::task::spawn_blocking(move || {
            let metadata = reader
                .fetch_metadata(Some(&name), timeout)
                .map_err(|e| format!("the metadata of `{name}`: {e}"))?;
            let mut assignment = TopicPartitionList::new();
            for partition in metadata.topics().iter().flat_map(|t| t.partitions()) {
                assignment
                    .add_partition_offset(&name, partition.id(), Offset::Stored)
                    .map_err(|e| e.to_string())?;
            }
            if assignment.count() == 0 {
                return Err(format!("Kafka has no topic `{name}`"));
            }
            reader.assign(&assignment).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok(Self {
            consumer,
            topic: topic.to_owned(),
        })
    }
}

impl LetterBox for KafkaLetters {
    fn peek(&mut self, limit: usize) -> BoxFuture<'_, Result<Vec<Letter>, String>> {
        let consumer = Arc::clone(&self.consumer);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || read(&consumer, limit))
                .await
                .map_err(|e| e.to_string())?
        })
    }

    fn remove<'a>(&'a mut self, letter: &'a Letter) -> BoxFuture<'a, Result<(), String>> {
        let consumer = Arc::clone(&self.consumer);
        let topic = self.topic.clone();
        let id = letter.id.clone();
        Box::pin(async move {
            let (partition, offset) = id
                .split_once('@')
                .and_then(|(p, o)| Some((p.parse::<i32>().ok()?, o.parse::<i64>().ok()?)))
                .ok_or_else(|| format!("`{id}` is not partition@offset"))?;
            tokio::task::spawn_blocking(move || {
                let mut past = TopicPartitionList::new();
                past.add_partition_offset(&topic, partition, Offset::Offset(offset + 1))
                    .map_err(|e| e.to_string())?;
                consumer
                    .commit(&past, CommitMode::Sync)
                    .map_err(|e| format!("committing {DEAD_LETTER_GROUP}'s offset past {id}: {e}"))
            })
            .await
            .map_err(|e| e.to_string())?
        })
    }

    fn selective(&self) -> Result<(), String> {
        Err(format!(
            "a Kafka topic cannot delete one record: a replay removes a dead letter by \
             committing the group `{DEAD_LETTER_GROUP}` past it, so it cannot leave one \
             behind and remove a later one"
        ))
    }
}

/// Up to `limit` records from the assigned partitions, until each is at its end or none
/// comes for [`IDLE`].
fn read(consumer: &BaseConsumer<KafkaContext>, limit: usize) -> Result<Vec<Letter>, String> {
    let partitions = consumer.assignment().map_err(|e| e.to_string())?.count();
    let mut at_end = 0;
    let mut letters = Vec::new();
    let mut last = Instant::now();
    while letters.len() < limit && at_end < partitions && last.elapsed() < IDLE {
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(_))) => at_end += 1,
            Some(Err(e))
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::UnknownTopicOrPartition) =>
            {
                return Err(e.to_string());
            }
            Some(Err(e)) => return Err(format!("reading dead letters: {e}")),
            Some(Ok(record)) => {
                last = Instant::now();
                letters.push(Letter {
                    id: format!("{}@{}", record.partition(), record.offset()),
                    key: record.key().map(bytes::Bytes::copy_from_slice),
                    headers: crate::queue::headers_of(&record),
                    payload: bytes::Bytes::copy_from_slice(record.payload().unwrap_or_default()),
                });
            }
        }
    }
    Ok(letters)
}
