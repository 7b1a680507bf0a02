//! The registry every handle of one [`MemoryStore`](super::MemoryStore) shares: the
//! registered policies with their key maps and bans, in registration order, and the cap on
//! keys.
//!
//! A handle keeps its own copy of the list (the `Arc`s of the entries, so the state is
//! shared) and reads it without a lock on the hot path. A registration through any handle
//! appends to the shared list under its lock; a handle whose copy is older (it was cloned
//! before) finds out when a charge names a policy beyond its copy, or when
//! [`Registry::count`] says so, and then answers through a fresh copy.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use super::MemoryStore;
use super::ban::Bans;
use super::keyed::Slot;
use crate::Policy;

/// One registered policy and its key map, shared by every handle.
pub(super) type Entry<K> = Arc<(Policy, Slot<K>)>;

/// The policies registered so far, as one handle sees them.
pub(super) struct Registered<K> {
    /// Every policy while none has a ban (empty otherwise).
    pub(super) policies: Vec<Entry<K>>,
    /// Every policy once one has a ban (empty otherwise).
    pub(super) banning: Vec<Entry<K>>,
    /// Per policy (by index), its bans when it has a [`Ban`](crate::Ban).
    pub(super) bans: Vec<Option<Arc<Bans<K>>>>,
    /// Whether some policy has a ban.
    pub(super) has_bans: bool,
}

impl<K> Registered<K> {
    pub(super) const fn new() -> Self {
        Self {
            policies: Vec::new(),
            banning: Vec::new(),
            bans: Vec::new(),
            has_bans: false,
        }
    }

    /// The number of registered policies.
    pub(super) fn len(&self) -> usize {
        self.bans.len()
    }

    /// Every entry in registration order.
    pub(super) fn entries(&self) -> &[Entry<K>] {
        if self.has_bans {
            &self.banning
        } else {
            &self.policies
        }
    }
}

impl<K> Clone for Registered<K> {
    fn clone(&self) -> Self {
        Self {
            policies: self.policies.clone(),
            banning: self.banning.clone(),
            bans: self.bans.clone(),
            has_bans: self.has_bans,
        }
    }
}

/// Makes an up-to-date handle on a store from any handle.
pub(super) type Refresh<K, C> = fn(&MemoryStore<K, C>) -> MemoryStore<K, C>;

/// What every handle of one store shares.
pub(super) struct Registry<K, C> {
    latest: Mutex<Registered<K>>,
    /// `latest.len()`, read without the lock.
    count: AtomicUsize,
    /// The cap on keys per policy (`usize::MAX`: none), for policies registered later.
    pub(super) max_keys: AtomicUsize,
    /// Makes an up-to-date handle: `Clone::clone` of the store, set by the first clone.
    /// Until then there is one handle, which is never stale, so a clock that is not
    /// `Clone` needs none.
    pub(super) refresh: OnceLock<Refresh<K, C>>,
}

impl<K, C> Registry<K, C> {
    pub(super) fn new() -> Self {
        Self {
            latest: Mutex::new(Registered::new()),
            count: AtomicUsize::new(0),
            max_keys: AtomicUsize::new(usize::MAX),
            refresh: OnceLock::new(),
        }
    }

    /// The shared list, locked (a poisoned lock is taken over: every change to the list is
    /// a single push).
    pub(super) fn lock(&self) -> MutexGuard<'_, Registered<K>> {
        self.latest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of registered policies.
    pub(super) fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Records the count after a registration (called with the lock held).
    pub(super) fn set_count(&self, count: usize) {
        self.count.store(count, Ordering::Release);
    }

    /// A copy of the shared list.
    pub(super) fn snapshot(&self) -> Registered<K> {
        self.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use std::num::{NonZeroU32, NonZeroUsize};
    use std::sync::Arc;
    use std::time::Duration;

    use crate::clock::ManualClock;
    use crate::store::{Charge, MemoryStore, Store};
    use crate::{Ban, Key, Policy, Quota};

    fn per_minute(name: &str, n: u32) -> Policy {
        Policy::new(name, Quota::per_minute(NonZeroU32::new(n).unwrap()))
    }

    #[test]
    fn clones_share_state_and_every_registration() {
        let mut a = MemoryStore::<Key, _>::with_clock(ManualClock::new());
        let first = a.register(&per_minute("first", 1)).unwrap();
        let mut b = a.clone();
        let key = Key::from("k");
        assert!(
            a.check_now(&[Charge::new(first, &key, 1)])
                .unwrap()
                .is_allowed()
        );
        assert!(
            !b.check_now(&[Charge::new(first, &key, 1)])
                .unwrap()
                .is_allowed()
        );

        // Registered through `b` after `a` was made: `a` knows it, charges the same state,
        // and the ids of both handles agree.
        let second = b.register(&per_minute("second", 1)).unwrap();
        assert_eq!(second.index(), 1);
        assert!(
            a.check_now(&[Charge::new(second, &key, 1)])
                .unwrap()
                .is_allowed()
        );
        assert!(
            !b.check_now(&[Charge::new(second, &key, 1)])
                .unwrap()
                .is_allowed()
        );
        assert_eq!(a.len(), 2);
        assert_eq!(a.reset_now(None, &key).unwrap().len(), 2);

        // A ban registered through `a` reaches `b`'s checks of that policy.
        let banned = a
            .register(
                &per_minute("login", 1).with_ban(
                    Ban::after(NonZeroU32::new(1).unwrap(), Duration::from_secs(60))
                        .lasting(Duration::from_secs(600)),
                ),
            )
            .unwrap();
        let third = a.register(&per_minute("third", 1)).unwrap();
        assert_eq!(third.index(), 3);
        let _ = b.check_now(&[Charge::new(banned, &key, 1)]).unwrap();
        let _ = b.check_now(&[Charge::new(banned, &key, 1)]).unwrap();
        assert!(
            a.ban_ends_in(banned, &key).is_some(),
            "the refusal through `b` banned"
        );

        // `Arc<MemoryStore>` is a store, and registers through the shared registry.
        let mut shared = Arc::new(b.clone());
        let fourth = shared.register(&per_minute("fourth", 1)).unwrap();
        assert_eq!(fourth.index(), 4);
        assert!(
            b.policy(fourth).is_none(),
            "`b` was made before: it looks it up on use"
        );
        assert!(
            b.check_now(&[Charge::new(fourth, &key, 1)])
                .unwrap()
                .is_allowed()
        );
        assert!(
            !shared
                .check_now(&[Charge::new(fourth, &key, 1)])
                .unwrap()
                .is_allowed()
        );
    }

    #[test]
    fn a_cap_set_on_one_handle_holds_for_every_clone() {
        let mut a = MemoryStore::<Key, _>::with_clock(ManualClock::new());
        let id = a.register(&per_minute("api", 1)).unwrap();
        let b = a.clone();
        let a = a.with_max_keys(NonZeroUsize::new(1).unwrap());
        assert!(
            b.check_now(&[Charge::new(id, &Key::from("x"), 1)])
                .unwrap()
                .is_allowed()
        );
        // The second key overflows into the shared overflow state, whichever handle.
        assert!(
            a.check_now(&[Charge::new(id, &Key::from("y"), 1)])
                .unwrap()
                .is_allowed()
        );
        assert!(
            !b.check_now(&[Charge::new(id, &Key::from("z"), 1)])
                .unwrap()
                .is_allowed()
        );
        assert_eq!(a.overflowed(), 2);
    }
}
