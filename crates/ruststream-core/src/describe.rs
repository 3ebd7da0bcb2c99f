//! How a broker connection and a subscription appear in a service's description of
//! itself (the AsyncAPI document the runtime writes).

/// A broker connection or a subscription, as a service describes it: the protocol, the
/// server (never its credentials), and the few broker-specific names a reader of the
/// description needs (the consumer group, the client id, the queue).
///
/// A transport's publisher fills the protocol and server ([`Publish::describe`]); its
/// descriptor adds what the subscription reads with ([`Descriptor::describe`]).
///
/// [`Publish::describe`]: crate::Publish::describe
/// [`Descriptor::describe`]: crate::Descriptor::describe
///
/// ```
/// use ruststream_core::Described;
///
/// let kafka = Described::new("kafka", "app:s3cret@broker-1:9092,broker-2:9092").group("billing");
/// assert_eq!(kafka.host, "broker-1:9092");
/// assert_eq!(kafka.group.as_deref(), Some("billing"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Described {
    /// The AsyncAPI protocol name: `kafka`, `nats`, `pulsar`, `amqp`, `redis`; empty for
    /// a broker inside the process (the memory broker), which has no server.
    pub protocol: &'static str,
    /// `host` or `host:port` of the (first) server, without user-info, path or query.
    pub host: String,
    /// The consumer group the subscription reads in: Kafka `group.id`, the JetStream
    /// durable, the Core NATS queue group, the Redis group, the Pulsar subscription.
    pub group: Option<String>,
    /// The client id the broker sees (Kafka `client.id`), when set.
    pub client_id: Option<String>,
    /// The queue a RabbitMQ subscription reads.
    pub queue: Option<String>,
    /// Settings of the subscription worth showing (`commit` = `tracked`, `kind` =
    /// `jetstream`), written as `x-ruststream-<name>` extensions.
    pub settings: Vec<(&'static str, String)>,
}

impl Described {
    /// A connection over `protocol` to the server(s) in `url` (a URL or a comma-separated
    /// list of them, with or without credentials: only the first host and port are kept).
    pub fn new(protocol: &'static str, url: &str) -> Self {
        Self {
            protocol,
            host: host_of(url),
            ..Self::default()
        }
    }

    /// Names the consumer group.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Adds a setting shown as `x-ruststream-<name>`.
    pub fn setting(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.settings.push((name, value.into()));
        self
    }
}

/// The first `host[:port]` of `url`: scheme, user-info (up to the last `@` before the
/// host), path and query removed.
fn host_of(url: &str) -> String {
    let first = url.split(',').next().unwrap_or("").trim();
    let first = match crate::split_userinfo(first) {
        Some((_, _, rest)) => &rest[1..],
        None => first.split_once("://").map_or(first, |(_, rest)| rest),
    };
    let end = first.find(['/', '?', '#']).unwrap_or(first.len());
    first[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn the_host_keeps_no_credentials_path_or_second_server() {
        for (url, host) in [
            ("nats://u:p@h:4222", "h:4222"),
            ("amqp://u:a#b?c@h:5672/%2f", "h:5672"),
            ("redis://:pw@h:6379/0", "h:6379"),
            ("pulsar+ssl://h:6651", "h:6651"),
            ("b1:9092,b2:9092", "b1:9092"),
            ("nats://h1:4222,nats://u:p@h2:4222", "h1:4222"),
            ("localhost", "localhost"),
        ] {
            assert_eq!(host_of(url), host, "{url}");
        }
    }
}
