//! The AsyncAPI document of a service on the memory broker: validated by the AsyncAPI
//! project's own parser (0 errors, 0 warnings), in JSON and YAML, and showing every
//! registration, dead letter and declared send with its schema.

use std::time::Duration;

use ruststream::asyncapi::Sends;
use ruststream::batch::Batch;
use ruststream::{App, BatchOutcome, HandlerOutcome, Message, memory::MemoryBroker, on, on_batch};
use ruststream_test_support::asyncapi::validate;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Order {
    id: u64,
    lines: Vec<Line>,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Line {
    sku: String,
    quantity: u32,
    kind: Kind,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
enum Kind {
    Item,
    Service,
}

async fn take_order(Message(_order): Message<Order>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

async fn audit(_payload: ruststream::Payload) -> HandlerOutcome {
    HandlerOutcome::ack()
}

async fn bill(_batch: Batch<Order>) -> BatchOutcome {
    BatchOutcome::ack_all()
}

fn service() -> App {
    let broker = MemoryBroker::new();
    App::new()
        .info("orders", "2.1.0")
        .register(
            on(broker.topic("orders"), take_order)
                .name("take-order")
                .schema::<Order>()
                .max_attempts(4)
                .dead_letter("orders.dead")
                .lanes(8),
        )
        .register(on(broker.topic("audit/all"), audit).name("audit"))
        .register(
            on_batch(broker.topic("billing"), bill)
                .name("bill")
                .schema::<Order>()
                .max_batch(100)
                .max_wait(Duration::from_millis(20)),
        )
        .sends(Sends::to(&broker.publisher(), "shipments").schema::<Line>())
}

#[test]
fn the_document_validates_in_json_and_yaml() {
    let document = service().asyncapi();
    for (text, extension) in [(document.json(), "json"), (document.yaml(), "yaml")] {
        let validated = validate(&text, extension);
        assert!(
            validated.clean,
            "{extension}:\n{}\n{text}",
            validated.report
        );
    }
}

#[test]
fn every_registration_dead_letter_and_send_is_an_operation_on_its_channel() {
    let document = service().asyncapi();
    let doc = document.value();
    assert_eq!(doc["asyncapi"], "3.0.0");
    assert_eq!(doc["info"]["title"], "orders");
    assert_eq!(doc["info"]["version"], "2.1.0");
    let operation = |id: &str| doc["operations"][id].clone();
    let address_of = |op: &Value| {
        let channel = op["channel"]["$ref"]
            .as_str()
            .unwrap()
            .trim_start_matches("#/channels/");
        doc["channels"][channel]["address"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for (id, action, address) in [
        ("take-order.receive", "receive", "orders"),
        ("take-order.dead-letter", "send", "orders.dead"),
        ("audit.receive", "receive", "audit/all"),
        ("bill.receive", "receive", "billing"),
        ("send.shipments", "send", "shipments"),
    ] {
        let op = operation(id);
        assert_eq!(op["action"], action, "{id}: {op}");
        assert_eq!(address_of(&op), address, "{id}");
    }
    // The memory broker redelivers by itself: no retry copies, so no retry operation.
    assert!(doc["operations"].get("take-order.retry").is_none());
    let take = operation("take-order.receive");
    assert_eq!(take["x-ruststream-max-attempts"], 4);
    assert_eq!(take["x-ruststream-lanes"], 8);
    assert_eq!(operation("bill.receive")["x-ruststream-max-batch"], 100);
    // Payload schemas: the declared type (nested types under components), or open.
    let message = |id: &str| doc["components"]["messages"][id].clone();
    assert_eq!(
        message("take-order.message")["payload"]["$ref"],
        "#/components/schemas/Order"
    );
    assert_eq!(
        message("take-order.dead-letter")["payload"]["$ref"],
        "#/components/schemas/Order"
    );
    assert_eq!(
        message("shipments.message")["payload"]["$ref"],
        "#/components/schemas/Line"
    );
    for schema in ["Order", "Line", "Kind"] {
        assert!(doc["components"]["schemas"][schema].is_object(), "{schema}");
    }
    assert!(
        message("audit.message")["payload"]["description"]
            .as_str()
            .unwrap()
            .contains("no schema declared")
    );
    let dead_headers = &message("take-order.dead-letter")["headers"]["properties"];
    for header in [
        "x-ruststream-dead-letter-reason",
        "x-ruststream-dead-letter-source",
        "x-ruststream-retry-count",
    ] {
        assert!(dead_headers[header].is_object(), "{header}");
    }
    assert!(!document.json().contains("#/definitions/"));
}

#[test]
fn the_parser_refuses_what_is_not_a_document() {
    // The validator is no rubber stamp: a document without `info` is an error.
    let validated = validate(r#"{"asyncapi": "3.0.0", "channels": {}}"#, "json");
    assert!(!validated.clean, "{}", validated.report);
}
