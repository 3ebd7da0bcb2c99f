//! The addresses a subscription reads, each held once and shared by its deliveries.

use std::collections::HashMap;
use std::sync::Arc;

/// Turns the topic name a client hands over with each message into the shared
/// `Arc<str>` a [`Delivery`](crate::Delivery) carries, allocating once per topic.
/// Messages mostly come from the topic of the one before, so that one is checked first,
/// without hashing.
#[derive(Debug)]
pub struct AddressNames {
    known: HashMap<String, Arc<str>>,
    last: Arc<str>,
}

impl Default for AddressNames {
    fn default() -> Self {
        Self {
            known: HashMap::new(),
            last: Arc::from(""),
        }
    }
}

impl AddressNames {
    /// The shared name of `name`.
    pub fn get(&mut self, name: &str) -> Arc<str> {
        Arc::clone(self.shared(name))
    }

    /// The shared name of `name`, borrowed: no reference counted for a caller that
    /// only looks at it (or clones it only sometimes).
    pub fn shared(&mut self, name: &str) -> &Arc<str> {
        if *self.last != *name {
            self.last = match self.known.get(name) {
                Some(known) => Arc::clone(known),
                None => {
                    let new: Arc<str> = Arc::from(name);
                    self.known.insert(name.to_owned(), Arc::clone(&new));
                    new
                }
            };
        }
        &self.last
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[test]
    fn one_allocation_per_name() {
        let mut names = super::AddressNames::default();
        let a = names.get("orders");
        let b = names.get("payments");
        let c = names.get("orders");
        assert!(Arc::ptr_eq(&a, &c));
        assert_eq!(&*b, "payments");
    }
}
