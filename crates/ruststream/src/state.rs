//! Shared application state, looked up by type.

use std::any::{Any, TypeId, type_name};
use std::fmt;
use std::sync::Arc;

use ruststream_core::hash::SpreadMap;

/// The values given to [`App::state`](crate::App::state), one per type.
#[derive(Default, Clone)]
pub struct StateMap {
    values: SpreadMap<TypeId, (Arc<dyn Any + Send + Sync>, &'static str)>,
}

impl StateMap {
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.values
            .insert(TypeId::of::<T>(), (Arc::new(value), type_name::<T>()));
    }

    /// The value of type `T`, if the app has one.
    pub fn get<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let (value, _) = self.values.get(&TypeId::of::<T>())?;
        Arc::clone(value).downcast::<T>().ok()
    }

    /// True when the app has a value of type `T`.
    pub fn contains<T: 'static>(&self) -> bool {
        self.values.contains_key(&TypeId::of::<T>())
    }
}

impl fmt::Debug for StateMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(self.values.values().map(|(_, name)| name))
            .finish()
    }
}
