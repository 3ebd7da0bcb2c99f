use ruststream::{HandlerOutcome, Message};

struct Database;

#[ruststream::handler]
async fn on_order(Message(id): Message<u64>, db: Database) -> HandlerOutcome {
    let _ = (id, db);
    HandlerOutcome::ack()
}

fn main() {}
