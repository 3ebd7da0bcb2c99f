//! Restart the broker twice while 10,000 messages flow from 4 publishers into a service
//! running as a separate process (`fault-service`, acking everything): the service
//! reconnects by itself, and every message whose publish the broker confirmed is handled.
//!
//! NATS, Pulsar and RabbitMQ run a broker process of this test's own (installed by
//! scripts/test), SIGKILLed and started again on the same port and data directory. Kafka runs
//! librdkafka's mock cluster: tansu keeps nothing across a restart (see brokers.md), so
//! its one broker is taken down (connections cut, new ones refused) and brought up again,
//! keeping its log and offsets. A pulsar-lite of the test's own is also frozen (SIGSTOP)
//! under a publisher, to see how its send fails (G3).
//!
//! The tests are in modules in this directory, one per broker; `support` holds the run
//! they share.

mod support;

mod kafka;
mod nats;
mod pulsar;
mod rabbitmq;
mod redis;
