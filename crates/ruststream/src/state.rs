//! Shared application state, looked up by type.

use std::any::{Any, TypeId, type_name};
use std::fmt;
use std::sync::Arc;

/// The values given to [`App::state`](crate::App::state), one per type.
///
/// A short list searched in order: an app has a handful of state types, and comparing
/// a few type ids costs less than hashing one (this runs for every `State` extraction).
#[derive(Default, Clone)]
pub struct StateMap {
    values: Vec<Entry>,
}

#[derive(Clone)]
struct Entry {
    id: TypeId,
    /// An `Arc<T>` for the entry's `T`: a lookup clones the `Arc` it finds, with no
    /// second check of the type than `downcast_ref`'s.
    value: Arc<dyn Any + Send + Sync>,
    name: &'static str,
}

impl StateMap {
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        let entry = Entry {
            id: TypeId::of::<T>(),
            value: Arc::new(Arc::new(value)),
            name: type_name::<T>(),
        };
        match self.values.iter_mut().find(|e| e.id == entry.id) {
            Some(existing) => *existing = entry,
            None => self.values.push(entry),
        }
    }

    fn find<T: 'static>(&self) -> Option<&Entry> {
        let id = TypeId::of::<T>();
        self.values.iter().find(|e| e.id == id)
    }

    /// The value of type `T`, if the app has one.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        self.find::<T>()?.value.downcast_ref::<Arc<T>>().cloned()
    }

    /// True when the app has a value of type `T`.
    pub fn contains<T: 'static>(&self) -> bool {
        self.find::<T>().is_some()
    }
}

impl fmt::Debug for StateMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.values.iter().map(|e| e.name))
            .finish()
    }
}
