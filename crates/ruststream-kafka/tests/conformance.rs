//! The behaviour suite on Kafka, in each commit mode, against the real broker.

mod common;

use std::time::Duration;

use common::{create_topic, kafka, unique};
use ruststream::Publisher;
use ruststream::conformance::Bed;
use ruststream_kafka::{Commit, EosPipeline, Grouped, Kafka, KafkaTopic};

struct Topics {
    kafka: Kafka,
    mode: Mode,
}

/// Which commit mode a bed's subscriptions use.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Auto,
    Tracked,
    Transactional,
}

impl Bed for Topics {
    type Descriptor = KafkaTopic<Grouped>;

    async fn address(&self) -> String {
        let topic = unique("suite");
        create_topic(&topic, 1).await;
        topic
    }

    fn subscribe(&self, address: &str, group: &str) -> KafkaTopic<Grouped> {
        let commit = match self.mode {
            Mode::Auto => Commit::Auto,
            Mode::Tracked => Commit::Tracked,
            // A transactional subscription commits through a pipeline of its own.
            Mode::Transactional => {
                Commit::Transactional(EosPipeline::new(&self.kafka, unique("suite-tx")))
            }
        };
        self.kafka
            .topic(address)
            .group(format!("{address}-{group}"))
            .commit(commit)
            .set("auto.commit.interval.ms", "100")
            .set("session.timeout.ms", "6000")
            .set("heartbeat.interval.ms", "500")
    }

    fn publisher(&self) -> Publisher {
        Publisher::new(std::sync::Arc::new(self.kafka.publisher()))
    }

    fn warm_up(&self) -> Duration {
        // The broker forms the group after about half the session timeout.
        Duration::from_secs(4)
    }

    fn keys(&self) -> bool {
        true
    }

    fn shares_one_address(&self) -> bool {
        // One partition per address: one member of a group reads it.
        false
    }

    fn label(&self) -> String {
        format!("Kafka Commit::{:?}", self.mode)
    }
}

mod tracked {
    async fn bed() -> super::Topics {
        super::Topics {
            kafka: super::kafka().await,
            mode: super::Mode::Tracked,
        }
    }
    ruststream::conformance_tests!(bed(), keys);
}

mod auto {
    async fn bed() -> super::Topics {
        super::Topics {
            kafka: super::kafka().await,
            mode: super::Mode::Auto,
        }
    }
    ruststream::conformance_tests!(bed(), keys);
}

/// Every scenario: with a declaration, retries and dead letters are copies produced
/// inside the window's transaction (K7), so nothing aborts; K6's abort-and-reread is
/// checked in `tests/eos/`.
mod transactional {
    async fn bed() -> super::Topics {
        super::Topics {
            kafka: super::kafka().await,
            mode: super::Mode::Transactional,
        }
    }
    ruststream::conformance_tests!(bed(), keys);
}
