//! The behaviour suite on Core NATS and on JetStream, against the real server.

mod common;

use std::time::Duration;

use common::{create_stream, nats, unique};
use ruststream::Publisher;
use ruststream::conformance::Bed;
use ruststream_nats::{CoreSubject, JetStreamConsumer, Nats};

struct Core(Nats);

impl Bed for Core {
    type Descriptor = CoreSubject;

    async fn address(&self) -> String {
        unique("suite")
    }

    fn subscribe(&self, address: &str, group: &str) -> CoreSubject {
        self.0.subject(address).queue_group(group)
    }

    fn publisher(&self) -> Publisher {
        Publisher::new(self.0.publish_handle())
    }

    fn warm_up(&self) -> Duration {
        // Core NATS keeps nothing for late subscribers: let the subscription reach the server.
        Duration::from_millis(200)
    }

    fn keys(&self) -> bool {
        false
    }

    fn label(&self) -> String {
        "NATS Core".into()
    }
}

struct JetStream(Nats);

impl Bed for JetStream {
    type Descriptor = JetStreamConsumer;

    /// A stream of its own, named like its one subject.
    async fn address(&self) -> String {
        let name = unique("SUITE");
        create_stream(&self.0, &name, std::slice::from_ref(&name)).await;
        name
    }

    fn subscribe(&self, address: &str, group: &str) -> JetStreamConsumer {
        self.0
            .consumer(address, group.replace('-', "_"))
            .filter_subject(address)
            // Short, so "never delivered again" can be waited out.
            .ack_wait(Duration::from_secs(2))
    }

    fn publisher(&self) -> Publisher {
        Publisher::new(self.0.publish_handle())
    }

    fn warm_up(&self) -> Duration {
        Duration::ZERO
    }

    fn redelivered_within(&self) -> Duration {
        Duration::from_secs(3)
    }

    fn keys(&self) -> bool {
        false
    }

    fn label(&self) -> String {
        "NATS JetStream".into()
    }
}

mod core {
    async fn bed() -> super::Core {
        super::Core(super::nats().await)
    }
    ruststream::conformance_tests!(bed());
}

mod jetstream {
    async fn bed() -> super::JetStream {
        super::JetStream(super::nats().await)
    }
    ruststream::conformance_tests!(bed());
}
