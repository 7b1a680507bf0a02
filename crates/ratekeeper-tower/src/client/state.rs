//! What the layer remembers: per key, the instant before which no request is sent.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use tokio::time::Instant;

/// Most keys remembered at once. When full, expired entries are dropped; if every entry is
/// still in force, a new key's announcement is not recorded (its requests go out as usual).
pub(crate) const MAX_KEYS: usize = 10_000;

#[derive(Debug, Default)]
pub(crate) struct Shared {
    blocked: Mutex<HashMap<String, Instant>>,
}

impl Shared {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is
        // one insert or remove), so a poisoned lock is used as is.
        self.blocked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instant requests for `key` wait for, if it is later than `now`.
    pub(crate) fn blocked_until(&self, key: &str, now: Instant) -> Option<Instant> {
        let mut map = self.map();
        match map.get(key) {
            Some(&until) if until > now => Some(until),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Holds requests for `key` until `until`, or longer if an earlier announcement asked.
    pub(crate) fn block(&self, key: &str, until: Instant, now: Instant) {
        let mut map = self.map();
        if let Some(old) = map.get_mut(key) {
            *old = (*old).max(until);
            return;
        }
        if map.len() >= MAX_KEYS {
            map.retain(|_, t| *t > now);
            if map.len() >= MAX_KEYS {
                return;
            }
        }
        map.insert(key.to_owned(), until);
    }

    pub(crate) fn clear(&self) {
        self.map().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn keeps_the_longest_wait_and_forgets_expired_keys() {
        let shared = Shared::default();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(shared.blocked_until("a", now), None);
        shared.block("a", now + 5 * s, now);
        shared.block("a", now + 2 * s, now);
        assert_eq!(shared.blocked_until("a", now), Some(now + 5 * s));
        assert_eq!(shared.blocked_until("b", now), None);
        assert_eq!(shared.blocked_until("a", now + 5 * s), None);
        assert!(shared.map().is_empty());
    }

    #[test]
    fn bounded_in_keys() {
        let shared = Shared::default();
        let now = Instant::now();
        let s = Duration::from_secs(1);
        for i in 0..MAX_KEYS {
            shared.block(&i.to_string(), now + s, now);
        }
        shared.block("one more", now + s, now);
        assert_eq!(shared.blocked_until("one more", now), None);
        assert_eq!(shared.map().len(), MAX_KEYS);
        // Once they expire, room is made.
        shared.block("later", now + 3 * s, now + 2 * s);
        assert_eq!(
            shared.blocked_until("later", now + 2 * s),
            Some(now + 3 * s)
        );
        assert_eq!(shared.map().len(), 1);
    }
}
