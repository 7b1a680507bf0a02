//! [`Permit`]: what an admitted request's response body holds.

use std::fmt;
use std::hash::Hash as _;

use ratekeeper_core::store::slots::SlotLease;

use super::counter::Slot;
use crate::adaptive::Permit as AdaptivePermit;

/// One admitted request's slot; released on drop.
pub(crate) enum Permit {
    /// A slot of a [`Local`](super::Local) counter.
    Local(Slot),
    /// A slot of a shared store (released by the lease's own drop).
    Shared(SlotLease),
    /// A place under an adaptive limit.
    Adaptive(AdaptivePermit),
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Local(slot) => {
                // The key may be personal data: only its hash is shown.
                let mut h = std::hash::DefaultHasher::new();
                slot.key().hash(&mut h);
                f.debug_struct("Permit")
                    .field("key_hash", &std::hash::Hasher::finish(&h))
                    .finish()
            }
            Self::Shared(lease) => f.debug_tuple("Permit").field(lease).finish(),
            Self::Adaptive(permit) => f.debug_tuple("Permit").field(permit).finish(),
        }
    }
}
