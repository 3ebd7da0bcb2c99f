//! Groups of registrations with their types erased, so a module can return its own.

use crate::registration::Registration;
use crate::runtime::mount::Mount;

/// Registrations with their types erased: what a function returns to hand over the
/// registrations of its module, merged into the app with [`App::merge`](crate::App::merge).
/// Erasing costs one allocation per registration, at build time; the per-message path is
/// the same as through [`App::register`](crate::App::register).
///
/// ```
/// use ruststream::{App, memory::MemoryBroker};
///
/// mod orders {
///     use ruststream::{on, HandlerOutcome, Message, Registrations, memory::MemoryBroker};
///
///     async fn on_order(Message(id): Message<u64>) -> HandlerOutcome {
///         HandlerOutcome::ack()
///     }
///
///     pub fn registrations(broker: &MemoryBroker) -> Registrations {
///         Registrations::new().register(on(broker.topic("orders"), on_order).max_attempts(3))
///     }
/// }
///
/// let broker = MemoryBroker::new();
/// let app = App::new().merge(orders::registrations(&broker));
/// ```
#[derive(Default)]
pub struct Registrations {
    mounts: Vec<Box<dyn Mount>>,
}

impl Registrations {
    /// No registrations yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a registration (see [`on`](crate::on)).
    pub fn register<D, S>(mut self, registration: Registration<D, S>) -> Self {
        self.mounts.push((registration.mount)(registration));
        self
    }

    /// Adds every registration of `other`.
    pub fn merge(mut self, other: Registrations) -> Self {
        self.mounts.extend(other.mounts);
        self
    }

    /// How many registrations there are.
    pub fn len(&self) -> usize {
        self.mounts.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.mounts.is_empty()
    }

    pub(crate) fn into_mounts(self) -> Vec<Box<dyn Mount>> {
        self.mounts
    }
}

impl std::fmt::Debug for Registrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.mounts.iter().map(|m| m.name()))
            .finish()
    }
}
