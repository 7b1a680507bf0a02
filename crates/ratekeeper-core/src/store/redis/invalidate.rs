//! Fleet invalidation: a reset made through one instance (which also lifts a ban) reaches
//! the local state of every other instance on the same Redis and prefix at once.
//!
//! Each store subscribes, on a dedicated connection, to the Redis pub/sub channel
//! `<prefix>:v2:invalidate` (regular pub/sub: on a Cluster, a `PUBLISH` to any node reaches
//! the subscribers of every node, so the store subscribes through one node of its list and
//! moves to the next when that one fails). After a reset's script call, the store that made
//! it publishes one message naming what it reset:
//!
//! ```text
//! <sha1 of the key's hash-tag body, 40 hex digits>[:<policy name>]
//! ```
//!
//! (no policy name: every policy of the key). The client key is never in the message, only
//! its digest; each receiver computes the digest of the keys it remembers. (A store also
//! publishes `hello:<instance id>` when it subscribes, and counts itself subscribed only
//! once that message came back to it: a subscription Redis refused, an ACL without
//! `SUBSCRIBE` for one, is then seen as down.) A receiver
//! forgets the negative-cache entries of that key under those policies, and the tiered
//! store drops its lease of them (the units, fenced by the reset, and the remembered
//! denial). A check sent before an invalidation arrived never brings its answer back into
//! the negative cache.
//!
//! **While the channel is down** (before the first subscription, or after the subscription
//! connection failed or stopped answering its pings, until it is subscribed again) the
//! store cannot hear of resets by others, so a remembered denial, a remembered ban
//! included, lasts at most [`UNSUBSCRIBED_HOLD`] from when Redis gave it, then the next
//! request asks Redis; and when the subscription is made again, every remembered denial is
//! dropped (a reset may have been missed meanwhile). A ping goes out every
//! [`PING_EVERY`] and the connection is taken for dead when the answer takes longer than
//! that, so a silently broken connection is noticed within two pings.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::keys;
use crate::Key;
use crate::store::PolicyId;

/// How long a remembered denial lasts at most while the invalidation channel is down.
pub(super) const UNSUBSCRIBED_HOLD: Duration = Duration::from_secs(1);
/// How often the subscription connection is pinged (and how long a ping may take).
pub(super) const PING_EVERY: Duration = Duration::from_secs(1);

/// What an invalidation names: every remembered state (the channel was down), or one client
/// key (by digest) under some policies.
#[derive(Debug)]
pub(crate) enum Invalidated {
    /// Everything: an invalidation may have been missed.
    All,
    /// One client key under `policies`.
    Key {
        /// The SHA-1 (hex) of the key's hash-tag body.
        digest: String,
        /// The policies reset (never empty).
        policies: Vec<PolicyId>,
    },
}

impl Invalidated {
    /// Whether the state of `key` under `policy` is invalidated.
    pub(crate) fn covers(&self, policy: PolicyId, key: &Key) -> bool {
        match self {
            Self::All => true,
            Self::Key { digest, policies } => {
                policies.contains(&policy) && *digest == self::digest(key)
            }
        }
    }
}

/// What a listener (the tiered store) does with an invalidation.
pub(crate) type Listener = Box<dyn Fn(&Invalidated) + Send + Sync>;

/// The channel's state, shared by the store and its subscription task.
pub(super) struct Invalidation {
    pub(super) channel: String,
    /// Where to subscribe: the standalone Redis, or each node of a Cluster in turn.
    pub(super) targets: Vec<redis::Client>,
    /// Whether the subscription is live (the negative cache reads it).
    pub(super) live: Arc<AtomicBool>,
    /// Bumped by every invalidation (a check sent before one never caches its answer).
    pub(super) epoch: Arc<AtomicU64>,
    /// Whether the first attempt to subscribe ended (live or failed).
    attempted: AtomicBool,
    /// Woken when the subscription becomes live or the first attempt fails.
    ready: Notify,
    /// Policy names by id (what a message names).
    names: RwLock<Vec<Arc<str>>>,
    pub(super) listeners: RwLock<Vec<Listener>>,
    /// Dropped with the store: ends the subscription task.
    pub(super) stop: watch::Sender<()>,
}

impl Invalidation {
    pub(super) fn new(prefix: &str, targets: Vec<redis::Client>) -> Self {
        Self {
            channel: format!("{prefix}:{}:invalidate", keys::VERSION),
            targets,
            live: Arc::new(AtomicBool::new(false)),
            epoch: Arc::new(AtomicU64::new(0)),
            attempted: AtomicBool::new(false),
            ready: Notify::new(),
            names: RwLock::new(Vec::new()),
            listeners: RwLock::new(Vec::new()),
            stop: watch::Sender::new(()),
        }
    }

    /// Records the name of the policy registered as `id` (ids are given in order).
    pub(super) fn register(&self, name: Arc<str>) {
        self.names
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(name);
    }

    /// Adds a listener, told of every invalidation after the negative cache.
    pub(super) fn listen(&self, listener: Listener) {
        self.listeners
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .push(listener);
    }

    /// Whether the subscription is live now.
    pub(super) fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Waits until the subscription is live or the first attempt failed, at most `within`.
    pub(super) async fn wait_first_attempt(&self, within: Duration) {
        let wait = async {
            loop {
                let woken = self.ready.notified();
                if self.is_live() || self.attempted.load(Ordering::Acquire) {
                    return;
                }
                woken.await;
            }
        };
        let _ = tokio::time::timeout(within, wait).await;
    }

    /// An attempt ended (live, or failed): wakes the build waiting for the first one.
    pub(super) fn attempt_ended(&self) {
        self.attempted.store(true, Ordering::Release);
        self.ready.notify_waiters();
    }

    /// The message for a reset of `key` under `policy` (`None`: every policy).
    pub(super) fn message(&self, policy: Option<PolicyId>, key: &Key) -> String {
        let mut out = digest(key);
        if let Some(name) = policy.and_then(|p| {
            self.names
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .get(p.index())
                .cloned()
        }) {
            out.push(':');
            out.push_str(&name);
        }
        out
    }

    /// What `payload` invalidates (`None`: nothing this store knows, or not a message).
    pub(super) fn parse(&self, payload: &[u8]) -> Option<Invalidated> {
        let text = std::str::from_utf8(payload).ok()?;
        let (digest, policy) = match text.split_once(':') {
            Some((d, p)) => (d, Some(p)),
            None => (text, None),
        };
        if digest.len() != 40 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let names = self.names.read().unwrap_or_else(PoisonError::into_inner);
        let policies: Vec<PolicyId> = names
            .iter()
            .enumerate()
            .filter(|(_, name)| policy.is_none_or(|p| p == &***name))
            .filter_map(|(i, _)| u32::try_from(i).ok().map(PolicyId::from_index))
            .collect();
        (!policies.is_empty()).then(|| Invalidated::Key {
            digest: digest.to_owned(),
            policies,
        })
    }
}

/// The digest a message names `key` by: the SHA-1 (hex) of its hash-tag body.
pub(crate) fn digest(key: &Key) -> String {
    sha1_smol::Sha1::from(keys::tag(key)).digest().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_names_the_key_by_digest_and_the_policy_by_name() {
        let inv = Invalidation::new("rl", Vec::new());
        inv.register(Arc::from("api"));
        inv.register(Arc::from("login"));
        let key = Key::from("secret-token");
        let one = inv.message(Some(PolicyId::from_index(1)), &key);
        assert!(!one.contains("secret"), "{one}");
        assert_eq!(one, format!("{}:login", digest(&key)));
        let Some(what) = inv.parse(one.as_bytes()) else {
            panic!("a message of this store")
        };
        assert!(what.covers(PolicyId::from_index(1), &key));
        assert!(!what.covers(PolicyId::from_index(0), &key));
        assert!(!what.covers(PolicyId::from_index(1), &Key::from("other")));
        let all = inv.parse(inv.message(None, &key).as_bytes()).unwrap();
        assert!(all.covers(PolicyId::from_index(0), &key));
        assert!(all.covers(PolicyId::from_index(1), &key));
        // Unknown policies and malformed messages invalidate nothing.
        assert!(
            inv.parse(format!("{}:nope", digest(&key)).as_bytes())
                .is_none()
        );
        assert!(inv.parse(b"not a digest").is_none());
        assert_eq!(inv.channel, "rl:v2:invalidate");
    }
}
