use std::rc::Rc;

use ruststream::{HandlerOutcome, Message};

#[ruststream::handler]
async fn on_order(Message(id): Message<u64>) -> HandlerOutcome {
    let seen = Rc::new(id);
    tokio::task::yield_now().await;
    let _ = seen;
    HandlerOutcome::ack()
}

fn main() {}
