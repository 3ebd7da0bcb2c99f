//! What the modules of this test binary share: the order every test publishes, and a
//! handler that acks it.

use ruststream::{HandlerOutcome, Message};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Order {
    pub(crate) id: u64,
    pub(crate) key: String,
}

pub(crate) async fn always_ack(Message(_o): Message<Order>) -> HandlerOutcome {
    HandlerOutcome::ack()
}

pub(crate) fn order(id: u64) -> Order {
    Order {
        id,
        key: format!("k{}", id % 8),
    }
}
