//! The behaviour suite on the memory broker, in both of its modes.
#![cfg(feature = "conformance")]

use std::time::Duration;

use ruststream::Publisher;
use ruststream::conformance::Bed;
use ruststream::memory::{MemoryBroker, MemoryTopic};

struct Memory {
    broker: MemoryBroker,
    runtime_retries: bool,
}

impl Bed for Memory {
    type Descriptor = MemoryTopic;

    async fn address(&self) -> String {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        format!(
            "suite-{}",
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        )
    }

    fn subscribe(&self, address: &str, group: &str) -> MemoryTopic {
        let topic = self.broker.topic(address).group(group);
        if self.runtime_retries {
            topic.runtime_retries()
        } else {
            topic
        }
    }

    fn publisher(&self) -> Publisher {
        self.broker.publisher()
    }

    fn warm_up(&self) -> Duration {
        Duration::ZERO
    }

    fn keys(&self) -> bool {
        true
    }

    fn label(&self) -> String {
        if self.runtime_retries {
            "memory broker, runtime retries".into()
        } else {
            "memory broker".into()
        }
    }
}

mod native {
    async fn bed() -> super::Memory {
        super::Memory {
            broker: ruststream::memory::MemoryBroker::new(),
            runtime_retries: false,
        }
    }
    ruststream::conformance_tests!(bed(), keys);
}

mod runtime_retries {
    async fn bed() -> super::Memory {
        super::Memory {
            broker: ruststream::memory::MemoryBroker::new(),
            runtime_retries: true,
        }
    }
    ruststream::conformance_tests!(bed(), keys);
}
