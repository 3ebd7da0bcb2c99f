//! The AsyncAPI 3.0.0 document, written from the registrations and declared sends.

use ruststream_core::{
    DEAD_LETTER_AT, DEAD_LETTER_ATTEMPTS, DEAD_LETTER_ENTRY, DEAD_LETTER_OFFSET,
    DEAD_LETTER_PARTITION, DEAD_LETTER_REASON, DEAD_LETTER_REGISTRATION, DEAD_LETTER_SEQUENCE,
    DEAD_LETTER_SOURCE, Described, RETRY_COUNT_HEADER,
};
use serde_json::{Map, Value, json};

use super::schema::{component_name, open_payload};
use super::{Entry, MessageSchema, Source};

/// The document's parts as they are gathered.
#[derive(Default)]
struct Parts {
    servers: Map<String, Value>,
    channels: Map<String, Value>,
    operations: Map<String, Value>,
    messages: Map<String, Value>,
    schemas: Map<String, Value>,
}

/// What a message is: its payload and which of the framework's headers it may carry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Received,
    RetryCopy,
    DeadLetter,
    Sent,
}

pub(crate) fn document(source: Source<'_>) -> Value {
    let mut parts = Parts::default();
    for entry in &source.entries {
        parts.registration(entry);
    }
    for sends in source.sends {
        let server = parts.server(&sends.server);
        let message = parts.message(
            &format!("{}.message", sends.address),
            sends.schema.as_ref(),
            &sends.address,
            Role::Sent,
        );
        let channel = parts.channel(&sends.address, server.as_deref(), &message);
        let id = sends
            .name
            .clone()
            .unwrap_or_else(|| format!("send.{}", sends.address));
        let operation = operation("send", &channel, &message, "The service sends it.");
        parts.operations.insert(component_name(&id), operation);
    }
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": source.title,
            "version": source.version,
            "description": "Written by ruststream from the service's registrations: what it \
                            reads, retries, dead-letters and sends.",
        },
        "defaultContentType": "application/json",
        "servers": parts.servers,
        "channels": parts.channels,
        "operations": parts.operations,
        "components": { "messages": parts.messages, "schemas": parts.schemas },
    })
}

impl Parts {
    fn registration(&mut self, entry: &Entry) {
        let server = self.server(&entry.server);
        let name = component_name(&entry.name);
        let received = self.message(
            &format!("{name}.message"),
            entry.schema.as_ref(),
            &entry.name,
            Role::Received,
        );
        let channel = self.channel(&entry.address, server.as_deref(), &received);
        if let Some(queue) = &entry.server.queue {
            let bindings = json!({"amqp": {"is": "queue", "queue": {"name": queue}, "bindingVersion": "0.3.0"}});
            self.channels[&channel]["bindings"] = bindings;
        }
        let summary = format!("`{}` handles each message.", entry.name);
        let mut receive = operation("receive", &channel, &received, &summary);
        if let Some(bindings) = operation_bindings(&entry.server) {
            receive["bindings"] = bindings;
        }
        for (key, value) in &entry.policy {
            receive[format!("x-ruststream-{key}")] = value.clone();
        }
        for (key, value) in &entry.server.settings {
            receive[format!("x-ruststream-{key}")] = Value::String(value.clone());
        }
        self.operations.insert(format!("{name}.receive"), receive);
        if let Some(retry) = &entry.retry {
            let copy = self.message(
                &format!("{name}.retry"),
                entry.schema.as_ref(),
                &entry.name,
                Role::RetryCopy,
            );
            let channel = self.channel(retry, server.as_deref(), &copy);
            let summary = format!(
                "`{}` publishes a retry copy of a message to try again.",
                entry.name
            );
            let send = operation("send", &channel, &copy, &summary);
            self.operations.insert(format!("{name}.retry"), send);
        }
        if let Some(dead) = &entry.dead_letter {
            let letter = self.message(
                &format!("{name}.dead-letter"),
                entry.schema.as_ref(),
                &entry.name,
                Role::DeadLetter,
            );
            let channel = self.channel(dead, server.as_deref(), &letter);
            let summary = format!("`{}` sends a message it gives up on here.", entry.name);
            let mut send = operation("send", &channel, &letter, &summary);
            send["x-ruststream-written-by"] = Value::String(entry.dead_letter_by.to_owned());
            self.operations.insert(format!("{name}.dead-letter"), send);
        }
    }

    /// The server's id, added once per protocol and host; `None` for a broker in the
    /// process.
    fn server(&mut self, described: &Described) -> Option<String> {
        if described.protocol.is_empty() {
            return None;
        }
        let found = self.servers.iter().find(|(_, server)| {
            server["protocol"] == described.protocol && server["host"] == described.host.as_str()
        });
        if let Some((id, _)) = found {
            return Some(id.clone());
        }
        let taken = |id: &str| self.servers.contains_key(id);
        let id = (1..)
            .map(|n| match n {
                1 => described.protocol.to_owned(),
                n => format!("{}-{n}", described.protocol),
            })
            .find(|id| !taken(id))
            .unwrap_or_default();
        let host = if described.host.is_empty() {
            "unknown"
        } else {
            &described.host
        };
        self.servers.insert(
            id.clone(),
            json!({"host": host, "protocol": described.protocol}),
        );
        Some(id)
    }

    /// The channel for `address` on `server` (made once per address and server), with
    /// `message` among its messages. Its id is the address made a valid key, prefixed
    /// with the server's when another broker has a channel of that name.
    fn channel(&mut self, address: &str, server: Option<&str>, message: &str) -> String {
        let servers = match server {
            Some(server) => json!([{"$ref": format!("#/servers/{server}")}]),
            None => Value::Null,
        };
        let found = self.channels.iter().find(|(_, channel)| {
            channel["address"] == address
                && channel.get("servers").unwrap_or(&Value::Null) == &servers
        });
        let id = match found {
            Some((id, _)) => id.clone(),
            None => {
                let plain = component_name(address);
                let id = [
                    plain.clone(),
                    format!("{}.{plain}", server.unwrap_or("in-process")),
                ]
                .into_iter()
                .chain((2..).map(|n| format!("{plain}.{n}")))
                .find(|id| !self.channels.contains_key(id))
                .unwrap_or_default();
                let mut channel = json!({"address": address, "messages": {}});
                if !servers.is_null() {
                    channel["servers"] = servers;
                }
                self.channels.insert(id.clone(), channel);
                id
            }
        };
        self.channels[&id]["messages"][message] =
            json!({"$ref": format!("#/components/messages/{message}")});
        id
    }

    /// Adds the message `id` and its schemas; returns the id.
    fn message(
        &mut self,
        id: &str,
        schema: Option<&MessageSchema>,
        owner: &str,
        role: Role,
    ) -> String {
        let id = component_name(id);
        let payload = match schema {
            Some(schema) => {
                for (name, body) in &schema.schemas {
                    self.schemas.insert(name.clone(), body.clone());
                }
                json!({"$ref": format!("#/components/schemas/{}", schema.name)})
            }
            None => open_payload(owner),
        };
        let summary = match role {
            Role::Received => format!("What `{owner}` reads."),
            Role::RetryCopy => format!(
                "A retry copy `{owner}` publishes: the message as it arrived, with its attempt count."
            ),
            Role::DeadLetter => format!(
                "A dead letter of `{owner}`: the last attempt as it arrived, with why it was given up (SPEC D6)."
            ),
            Role::Sent => format!("What the service sends to `{owner}`."),
        };
        let message = json!({
            "name": id,
            "summary": summary,
            "contentType": "application/json",
            "payload": payload,
            "headers": headers(role),
        });
        self.messages.insert(id.clone(), message);
        id
    }
}

fn operation(action: &str, channel: &str, message: &str, summary: &str) -> Value {
    json!({
        "action": action,
        "summary": summary,
        "channel": {"$ref": format!("#/channels/{channel}")},
        "messages": [{"$ref": format!("#/channels/{channel}/messages/{message}")}],
    })
}

/// The broker's bindings for a receive operation, where AsyncAPI defines them.
fn operation_bindings(described: &Described) -> Option<Value> {
    let text = |value: &str| json!({"type": "string", "enum": [value]});
    match described.protocol {
        "kafka" => {
            let mut kafka = json!({"bindingVersion": "0.5.0"});
            if let Some(group) = &described.group {
                kafka["groupId"] = text(group);
            }
            if let Some(client) = &described.client_id {
                kafka["clientId"] = text(client);
            }
            Some(json!({"kafka": kafka}))
        }
        "nats" => described
            .group
            .as_ref()
            .filter(|_| {
                described
                    .settings
                    .iter()
                    .any(|(k, v)| *k == "kind" && v == "core")
            })
            .map(|queue| json!({"nats": {"queue": queue, "bindingVersion": "0.1.0"}})),
        _ => None,
    }
}

/// The headers the framework writes on a message of this role (others may be there).
fn headers(role: Role) -> Value {
    let text = |description: &str| json!({"type": "string", "description": description});
    let mut properties = Map::new();
    if role != Role::Sent {
        properties.insert(
            RETRY_COUNT_HEADER.to_owned(),
            text("Retries so far, written on retry copies where the broker counts nothing (decimal)."),
        );
    }
    if role == Role::DeadLetter {
        for (name, description) in [
            (
                DEAD_LETTER_REASON,
                "Why it was given up: the outcome, error, panic, deadline or decode refusal (one line, at most 1 KiB).",
            ),
            (
                DEAD_LETTER_REGISTRATION,
                "The registration that gave it up.",
            ),
            (DEAD_LETTER_SOURCE, "The address it was read from."),
            (DEAD_LETTER_ATTEMPTS, "Attempts made (decimal)."),
            (DEAD_LETTER_AT, "When it was given up (RFC 3339, UTC)."),
            (DEAD_LETTER_PARTITION, "Kafka: the original's partition."),
            (DEAD_LETTER_OFFSET, "Kafka: the original's offset."),
            (
                DEAD_LETTER_SEQUENCE,
                "JetStream and the memory broker: the original's stream sequence.",
            ),
            (DEAD_LETTER_ENTRY, "Redis Streams: the original entry's id."),
        ] {
            properties.insert(name.to_owned(), text(description));
        }
    }
    json!({"type": "object", "properties": properties})
}
