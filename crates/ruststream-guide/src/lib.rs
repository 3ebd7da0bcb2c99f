//! The user guide in `docs/`, tested. Each page is included here under `cfg(doctest)`, so
//! `cargo test --doc` compiles and runs every Rust block in it against this workspace's
//! crates (blocks that need a broker read its address from the test command's variables;
//! `no_run` marks the few that only compile, each saying why). `tests/spec.rs` keeps the
//! spec's test lists current and `tests/links.rs` keeps every link inside the repository.

// No function over 80 lines of code (clippy.toml), in library code (ARCHITECTURE.md).
#![deny(clippy::too_many_lines)]

macro_rules! pages {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[cfg(doctest)]
            #[doc = include_str!(concat!("../../../docs/", $file))]
            pub struct $name;
        )*
    };
}

pages! {
    GettingStarted => "getting-started.md",
    Kafka => "kafka.md",
    Nats => "nats.md",
    Pulsar => "pulsar.md",
    RabbitMq => "rabbitmq.md",
    RedisStreams => "redis.md",
    ConnectingSecurely => "connecting-securely.md",
    Testing => "testing.md",
    TestingUnderFaults => "testing-under-faults.md",
    Operating => "operating.md",
    AsyncApi => "asyncapi.md",
    Cli => "cli.md",
    DeadLetters => "dead-letters.md",
    Defaults => "defaults.md",
    Failures => "failures.md",
    Batches => "batches.md",
    Scaling => "scaling.md",
    Database => "database.md",
    Installing => "installing.md",
    Kubernetes => "kubernetes.md",
    Brokers => "brokers.md",
}
