//! [`Counter`]: requests in flight per key, in this process's memory, and the [`Slot`] an
//! admitted request holds.

use std::sync::Arc;

use dashmap::DashMap;
use ratekeeper_core::Key;

/// Requests in flight per key.
pub(crate) struct Counter {
    max: u32,
    counts: DashMap<Key, u32, foldhash::fast::RandomState>,
}

impl Counter {
    pub(crate) fn new(max: u32) -> Self {
        Self {
            max,
            counts: DashMap::default(),
        }
    }

    pub(crate) fn max(&self) -> u32 {
        self.max
    }

    /// Requests of `key` in flight now.
    pub(crate) fn in_flight(&self, key: &Key) -> u32 {
        self.counts.get(key).map_or(0, |c| *c)
    }
}

/// One slot of a [`Counter`]; released on drop.
pub(crate) struct Slot {
    counter: Arc<Counter>,
    key: Key,
}

impl Slot {
    pub(crate) fn key(&self) -> &Key {
        &self.key
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.counter.release(&self.key);
    }
}

impl Counter {
    /// Takes a slot for `key`: the free slots left after it, or `None` when all `max` are
    /// taken.
    pub(crate) fn acquire(self: &Arc<Self>, key: &Key) -> Option<(Slot, u32)> {
        let mut count = self.counts.entry(key.clone()).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        let free = self.max - *count;
        drop(count);
        Some((
            Slot {
                counter: Arc::clone(self),
                key: key.clone(),
            },
            free,
        ))
    }

    fn release(&self, key: &Key) {
        let now_zero = match self.counts.get_mut(key) {
            Some(mut count) => {
                *count = count.saturating_sub(1);
                *count == 0
            }
            None => false,
        };
        if now_zero {
            // Only if no request took the slot in between.
            self.counts.remove_if(key, |_, count| *count == 0);
        }
    }
}
