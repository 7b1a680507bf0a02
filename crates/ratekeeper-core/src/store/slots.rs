//! Concurrency slots shared by several app instances.
//!
//! A [`SharedSlots`] store counts, per client key, the requests in flight on **every**
//! instance that shares it, so "at most `max` concurrent requests per key" holds across a
//! fleet (a payment gateway's "100 concurrent transactions per merchant"). Acquiring a slot
//! is asynchronous (a networked store does one round trip); an acquired slot is a
//! [`SlotLease`], released when it is dropped. The keyed concurrency layer of
//! `ratekeeper-tower` (its `ConcurrencyLimitLayer::shared` builder option) holds the lease
//! until the response body ends.
//!
//! With the `redis` feature, `RedisStore::slots` gives the Redis implementation, whose slots
//! are leases renewed while their request runs and that expire on their own when an
//! instance dies.
//!
//! # Example
//!
//! A single-process implementation (for tests; the layer's own counter does this without
//! the boxing):
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use ratekeeper_core::Key;
//! use ratekeeper_core::store::slots::{AcquireFuture, Acquired, SharedSlots, SlotLease};
//!
//! #[derive(Default)]
//! struct OneProcess(Arc<Mutex<u32>>);
//!
//! struct Release(Arc<Mutex<u32>>);
//! impl Drop for Release {
//!     fn drop(&mut self) {
//!         *self.0.lock().unwrap() -= 1;
//!     }
//! }
//!
//! impl SharedSlots for OneProcess {
//!     fn acquire(&self, _key: &Key, max: u32) -> AcquireFuture {
//!         let mut held = self.0.lock().unwrap();
//!         let answer = if *held < max {
//!             *held += 1;
//!             Acquired::Held {
//!                 lease: SlotLease::new(Release(Arc::clone(&self.0))),
//!                 free: max - *held,
//!             }
//!         } else {
//!             Acquired::Full
//!         };
//!         Box::pin(std::future::ready(Ok(answer)))
//!     }
//! }
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let slots = OneProcess::default();
//! let key = Key::from("merchant-7");
//! let first = slots.acquire(&key, 1).await.unwrap();
//! assert!(matches!(first, Acquired::Held { free: 0, .. }));
//! assert!(matches!(slots.acquire(&key, 1).await.unwrap(), Acquired::Full));
//! drop(first); // releases the slot
//! assert!(matches!(slots.acquire(&key, 1).await.unwrap(), Acquired::Held { .. }));
//! # });
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::StoreError;
use crate::Key;

/// An acquired slot: released when dropped (whatever it holds is dropped then).
pub struct SlotLease {
    _release: Box<dyn Send + Sync>,
}

impl SlotLease {
    /// A lease whose release is the drop of `release`.
    pub fn new(release: impl Send + Sync + 'static) -> Self {
        Self {
            _release: Box::new(release),
        }
    }
}

impl fmt::Debug for SlotLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotLease").finish_non_exhaustive()
    }
}

/// The answer of [`SharedSlots::acquire`].
#[derive(Debug)]
pub enum Acquired {
    /// A slot is held until `lease` is dropped; `free` slots are left for the key.
    Held {
        /// The slot.
        lease: SlotLease,
        /// Slots still free for the key after this one (`max - held`).
        free: u32,
    },
    /// All `max` slots of the key are taken.
    Full,
}

/// The future of [`SharedSlots::acquire`].
pub type AcquireFuture = Pin<Box<dyn Future<Output = Result<Acquired, StoreError>> + Send>>;

/// Per-key concurrency slots shared by every instance that uses the same store.
pub trait SharedSlots: Send + Sync + 'static {
    /// Takes one of the `max` slots of `key`, or answers [`Acquired::Full`].
    ///
    /// The future may be dropped before it answers (the client disconnected, an outer
    /// timeout): an implementation that takes the slot remotely must then give it back
    /// itself, since no [`SlotLease`] exists to release it (the Redis implementation arms a
    /// guard before it sends the call).
    ///
    /// # Errors
    ///
    /// A store error when the store could not decide; a [`StoreError::Failed`] carries the
    /// store's failure policy (fail open, fail closed...).
    fn acquire(&self, key: &Key, max: u32) -> AcquireFuture;
}
