//! The behaviour suite on RabbitMQ classic and quorum queues, against the rabbitmq-server
//! the test command starts (`RUSTSTREAM_RABBITMQ_URL`).

use std::time::Duration;

use ruststream::Publisher;
use ruststream::conformance::Bed;
use ruststream_rabbitmq::{QueueKind, RabbitMq, RabbitQueue};

mod common;
use common::rabbit;

struct Queues {
    rabbit: RabbitMq,
    kind: QueueKind,
}

impl Bed for Queues {
    type Descriptor = RabbitQueue;

    /// A new durable queue of the bed's kind.
    async fn address(&self) -> String {
        let name = format!("suite-{}", ruststream_test_support::unique_suffix());
        self.rabbit
            .declare_queue(&name, self.kind)
            .await
            .expect("declare the queue");
        name
    }

    fn subscribe(&self, address: &str, _group: &str) -> RabbitQueue {
        // A queue is shared by its consumers: the group is the queue.
        self.rabbit.queue(address).kind(self.kind).prefetch(64)
    }

    fn publisher(&self) -> Publisher {
        Publisher::new(self.rabbit.publish_handle())
    }

    fn warm_up(&self) -> Duration {
        Duration::ZERO
    }

    fn keys(&self) -> bool {
        false
    }

    fn label(&self) -> String {
        match self.kind {
            QueueKind::Quorum => "RabbitMQ quorum queue".into(),
            _ => "RabbitMQ classic queue".into(),
        }
    }
}

mod classic {
    async fn bed() -> super::Queues {
        super::Queues {
            rabbit: super::rabbit().await,
            kind: super::QueueKind::Classic,
        }
    }
    ruststream::conformance_tests!(bed());
}

mod quorum {
    async fn bed() -> super::Queues {
        super::Queues {
            rabbit: super::rabbit().await,
            kind: super::QueueKind::Quorum,
        }
    }
    ruststream::conformance_tests!(bed());
}
