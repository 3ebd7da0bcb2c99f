use std::sync::Arc;

use ruststream::memory::MemoryBroker;
use ruststream::{App, HandlerOutcome, Message, Meta, State, on};

struct Database;

#[ruststream::handler]
async fn on_order(
    Message(id): Message<u64>,
    meta: Meta,
    State(db): State<Arc<Database>>,
) -> Result<HandlerOutcome, std::io::Error> {
    let _ = (id, meta.attempt, db);
    tokio::task::yield_now().await;
    Ok(HandlerOutcome::ack())
}

fn main() {
    let broker = MemoryBroker::new();
    let _app = App::new()
        .state(Arc::new(Database))
        .register(on(broker.topic("orders"), on_order));
}
