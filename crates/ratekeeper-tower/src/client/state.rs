//! What the layer remembers: per key, the instant before which no request is sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Most keys remembered at once. When full, expired entries are dropped; if every entry is
/// still in force, a new key's announcement is not recorded (its requests go out as usual).
pub(crate) const MAX_KEYS: usize = 10_000;

#[derive(Debug, Default)]
pub(crate) struct Shared {
    blocked: Mutex<HashMap<String, Blocked>>,
    /// Woken when a recorded wait is shortened or cleared, so that requests already
    /// waiting look again.
    shortened: Arc<Notify>,
}

/// A recorded wait: requests for the key wait until `until`; `announced` is when the answer
/// that set it arrived.
#[derive(Debug, Clone, Copy)]
struct Blocked {
    until: Instant,
    announced: Instant,
}

impl Shared {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Blocked>> {
        // A panic while holding this lock cannot leave the map inconsistent (every update is
        // one insert or remove), so a poisoned lock is used as is.
        self.blocked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instant requests for `key` wait for, if it is later than `now`.
    pub(crate) fn blocked_until(&self, key: &str, now: Instant) -> Option<Instant> {
        let mut map = self.map();
        match map.get(key) {
            Some(b) if b.until > now => Some(b.until),
            Some(_) => {
                map.remove(key);
                None
            }
            None => None,
        }
    }

    /// Records what the answer to a request for `key`, sent at `sent`, announced: requests
    /// wait until `until` (`until <= now`: no wait).
    ///
    /// The latest word wins: an answer to a request sent after the recorded wait was
    /// announced replaces it, shorter or longer (the server has seen that request, so it
    /// knows better). An answer to a request sent before (it crossed the announcement on the
    /// way) can only lengthen the wait.
    pub(crate) fn record(&self, key: &str, until: Instant, sent: Instant, now: Instant) {
        let mut map = self.map();
        if let Some(old) = map.get_mut(key) {
            if old.announced <= sent {
                let shorter = until < old.until;
                if until <= now {
                    map.remove(key);
                } else {
                    *old = Blocked {
                        until,
                        announced: now,
                    };
                }
                drop(map);
                if shorter {
                    self.shortened.notify_waiters();
                }
            } else if until > old.until {
                *old = Blocked {
                    until,
                    announced: now,
                };
            }
            return;
        }
        if until <= now {
            return;
        }
        if map.len() >= MAX_KEYS {
            map.retain(|_, b| b.until > now);
            if map.len() >= MAX_KEYS {
                return;
            }
        }
        map.insert(
            key.to_owned(),
            Blocked {
                until,
                announced: now,
            },
        );
    }

    pub(crate) fn clear(&self) {
        self.map().clear();
        self.shortened.notify_waiters();
    }

    /// A future that completes at the next shortened or cleared wait (created now, it sees
    /// every one from now on, polled or not).
    pub(crate) fn shortened(&self) -> tokio::sync::futures::OwnedNotified {
        Arc::clone(&self.shortened).notified_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_later_answer_replaces_the_wait_and_a_crossing_one_only_lengthens_it() {
        let shared = Shared::default();
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(shared.blocked_until("a", t0), None);
        // Announced at t0 + 1 s: wait until t0 + 60 s.
        shared.record("a", t0 + 60 * s, t0, t0 + s);
        // The answer to a request sent before that announcement cannot shorten it...
        shared.record("a", t0 + 2 * s, t0, t0 + 2 * s);
        assert_eq!(shared.blocked_until("a", t0 + 2 * s), Some(t0 + 60 * s));
        // ...but can lengthen it.
        shared.record("a", t0 + 90 * s, t0, t0 + 3 * s);
        assert_eq!(shared.blocked_until("a", t0 + 3 * s), Some(t0 + 90 * s));
        // The answer to a request sent after it replaces it, shorter included.
        shared.record("a", t0 + 5 * s, t0 + 4 * s, t0 + 4 * s);
        assert_eq!(shared.blocked_until("a", t0 + 4 * s), Some(t0 + 5 * s));
        // "Go on" from a later request clears it.
        shared.record("a", t0 + 4 * s, t0 + 4 * s, t0 + 4 * s);
        assert_eq!(shared.blocked_until("a", t0 + 4 * s), None);
        let now = t0;
        shared.record("a", now + 5 * s, now, now);
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
            shared.record(&i.to_string(), now + s, now, now);
        }
        shared.record("one more", now + s, now, now);
        assert_eq!(shared.blocked_until("one more", now), None);
        assert_eq!(shared.map().len(), MAX_KEYS);
        // Once they expire, room is made.
        shared.record("later", now + 3 * s, now + 2 * s, now + 2 * s);
        assert_eq!(
            shared.blocked_until("later", now + 2 * s),
            Some(now + 3 * s)
        );
        assert_eq!(shared.map().len(), 1);
    }
}
