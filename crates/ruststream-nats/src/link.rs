//! Whether a NATS connection is up, for the readiness check of the subscriptions on it.

use std::sync::Arc;

use ruststream_core::LinkProbe;

/// Up while the client is connected (it reconnects by itself after a loss).
pub(crate) fn link(client: &async_nats::Client) -> LinkProbe {
    let client = client.clone();
    Arc::new(move || client.connection_state() == async_nats::connection::State::Connected)
}
