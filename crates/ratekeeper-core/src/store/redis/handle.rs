//! What the clones of one [`RedisStore`] share beyond the connection: the registry of
//! policies (and the failure policy's stand-ins for them), and how a handle made before a
//! registration catches up.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::RedisStore;
use super::failure::Failover;
use super::policy::RedisPolicy;

/// The policies registered through any handle of one [`RedisStore`], and the failure
/// policy's stand-ins for them.
pub(super) struct Registry {
    pub(super) policies: Arc<Vec<RedisPolicy>>,
    pub(super) failover: Failover,
}

/// A handle on the same store: the same connection (or Cluster client), scripts, circuit
/// breaker, negative cache, counters and failure policy, and the same registry of policies
/// (a policy registered through any clone is known to every clone).
impl Clone for RedisStore {
    fn clone(&self) -> Self {
        let latest = self.shared.lock_registry();
        Self {
            policies: Arc::clone(&latest.policies),
            failover: latest.failover.clone(),
            local_policies: Arc::clone(&self.local_policies),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl RedisStore {
    /// A handle with every policy registered so far through any clone, when this one's list
    /// is older (`None`: it is up to date).
    #[cold]
    #[inline(never)]
    pub(super) fn refreshed(&self) -> Option<Self> {
        (self.shared.registered.load(Ordering::Acquire) != self.policies.len())
            .then(|| self.clone())
    }
}
