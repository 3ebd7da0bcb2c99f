//! The AsyncAPI document of a service on the memory broker: validated by the AsyncAPI
//! project's own parser (0 errors, 0 warnings), in JSON and YAML, and showing every
//! registration, dead letter and declared send with its schema.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use ruststream::asyncapi::Sends;
use ruststream::batch::Batch;
use ruststream::{App, BatchOutcome, HandlerOutcome, Message, memory::MemoryBroker, on, on_batch};
use ruststream_test_support::asyncapi::validate;
use ruststream_test_support::ops::get;
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
            .contains("No schema declared")
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

#[tokio::test]
async fn the_ops_endpoint_serves_the_document_and_says_how_to_get_the_page() {
    let app = service().ops(0);
    let document = app.asyncapi();
    let running = app.start().await.expect("start");
    let addr = running.ops_addr().expect("ops endpoint");
    assert_eq!(get(addr, "/asyncapi.json").await, (200, document.json()));
    assert_eq!(get(addr, "/asyncapi.yaml").await, (200, document.yaml()));
    let (status, page) = get(addr, "/asyncapi").await;
    assert_eq!(status, 200);
    assert!(
        page.contains("npm install @asyncapi/react-component@3"),
        "{page}"
    );
    assert!(page.contains(r#"href="/asyncapi.json""#), "{page}");
    assert_eq!(get(addr, "/asyncapi/bundle.js").await.0, 404);
    running.stop().await;
}

#[tokio::test]
async fn a_page_bundle_that_cannot_be_read_fails_the_start_naming_it() {
    let error = service()
        .ops(0)
        .asyncapi_page("/nonexistent/index.js")
        .start()
        .await
        .expect_err("the start must fail");
    let text = error.to_string();
    assert!(text.contains("/nonexistent/index.js"), "{text}");
}

/// The AsyncAPI React component's standalone bundle, as the test command installs it.
fn bundle() -> PathBuf {
    let node_modules = std::env::var("RUSTSTREAM_ASYNCAPI_NODE_PATH")
        .expect("RUSTSTREAM_ASYNCAPI_NODE_PATH is not set: run the tests through scripts/test");
    PathBuf::from(node_modules).join("@asyncapi/react-component/browser/standalone/index.js")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_renders_every_channel_in_headless_chromium() {
    let chromium = std::env::var("RUSTSTREAM_CHROMIUM")
        .expect("RUSTSTREAM_CHROMIUM is not set: run the tests through scripts/test");
    let app = service().ops(0).asyncapi_page(bundle());
    let document = app.asyncapi();
    let running = app.start().await.expect("start");
    let url = format!(
        "http://{}/asyncapi",
        running.ops_addr().expect("ops endpoint")
    );
    let (status, page) = get(running.ops_addr().unwrap(), "/asyncapi").await;
    assert_eq!(status, 200);
    assert!(page.contains("AsyncApiStandalone.render"), "{page}");
    let screenshot = std::env::var("RUSTSTREAM_ASYNCAPI_SCREENSHOT").ok();
    let dom = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(chromium);
        command.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--virtual-time-budget=20000",
        ]);
        if let Some(file) = screenshot {
            command
                .arg(format!("--screenshot={file}"))
                .arg("--window-size=1280,1400");
            let _ = command.arg(&url).output();
            let mut command = Command::new(std::env::var("RUSTSTREAM_CHROMIUM").unwrap());
            command.args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=20000",
            ]);
            return command.arg("--dump-dom").arg(&url).output();
        }
        command.arg("--dump-dom").arg(&url).output()
    })
    .await
    .unwrap()
    .expect("run chromium");
    running.stop().await;
    let dom = String::from_utf8_lossy(&dom.stdout);
    // What the component rendered: the page's div, not the document inlined in a script.
    let rendered = dom
        .split_once(r#"<div id="asyncapi">"#)
        .and_then(|(_, rest)| rest.split_once("<script"))
        .map(|(div, _)| div.to_owned())
        .unwrap_or_default();
    assert!(rendered.len() > 1000, "nothing rendered:\n{dom}");
    let channels = document.value()["channels"].as_object().unwrap();
    assert!(!channels.is_empty());
    for channel in channels.values() {
        let address = channel["address"].as_str().unwrap();
        assert!(
            rendered.contains(address),
            "channel `{address}` not in the rendered page:\n{rendered}"
        );
    }
    assert!(rendered.contains("take-order"), "{rendered}");
}
