//! The behaviour suite on Redis Streams, against the redis-server the test command starts
//! (`RUSTSTREAM_REDIS_URL`).

use std::time::Duration;

use ruststream::Publisher;
use ruststream::conformance::Bed;
use ruststream_redis::{Redis, RedisStream};

mod common;

/// The claim timeout the suite runs with: short, so an entry left without an outcome
/// comes back within the suite's patience.
const CLAIM: Duration = Duration::from_secs(1);

struct Streams {
    redis: Redis,
}

impl Bed for Streams {
    type Descriptor = RedisStream;

    /// A new stream name (the group creates it).
    async fn address(&self) -> String {
        format!("suite-{}", ruststream_test_support::unique_suffix())
    }

    fn subscribe(&self, address: &str, group: &str) -> RedisStream {
        self.redis.stream(address, group).claim_timeout(CLAIM)
    }

    fn publisher(&self) -> Publisher {
        Publisher::new(self.redis.publish_handle())
    }

    fn warm_up(&self) -> Duration {
        Duration::ZERO
    }

    fn keys(&self) -> bool {
        false
    }

    fn redelivered_within(&self) -> Duration {
        CLAIM * 3
    }

    fn label(&self) -> String {
        "Redis Streams".into()
    }
}

async fn bed() -> Streams {
    Streams {
        redis: common::redis().await,
    }
}

ruststream::conformance_tests!(bed());
