//! [`Plan`]: the charges a resolver builds for one request, and [`Applied`], the charges the
//! layer then holds until the response is settled.

use std::fmt;

use ratekeeper_core::Key;
use ratekeeper_core::store::{Charge, PolicyId};
use smallvec::SmallVec;

use crate::key::KeyError;

/// One charge of a plan: a policy index, its key (`None`: the layer's key) and cost.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) index: u32,
    pub(crate) key: Option<Key>,
    pub(crate) cost: u64,
}

/// The charges a [`Resolve`](super::Resolve) strategy builds for one request.
///
/// Policies are named as they were added to the builder. Naming a policy the layer does not
/// have answers the request with `500` and an error log line (a bug in the resolver; the
/// built-in resolvers check names when the layer is built).
///
/// Charging one policy more than once for the same key in one request (`charge("a")` twice,
/// or `charge_cost` and `charge_with` the layer's key) is **one** charge of the summed cost
/// (saturating at `u64::MAX` units): the request takes that many units of the policy's budget
/// at once, its headers and [`Info`](crate::info::Info) show one decision for the policy, and
/// when the sum is larger than the policy's capacity the request can never be allowed. It is
/// then answered at once, like any cost larger than the capacity: a `429` without
/// `Retry-After`, and no waiting in Delay mode ([`RateLimitBuilder::mode`](crate::RateLimitBuilder::mode); checked
/// one after the other, each part could fit while the whole never does, and the request
/// would be told to retry for ever). Charges of one policy under different keys
/// (`charge_with` another key) are separate budgets and stay separate charges.
pub struct Plan<'a> {
    names: &'a [Box<str>],
    key: &'a Key,
    cost: u64,
    pub(super) entries: SmallVec<[Entry; 2]>,
    exempt: bool,
    pub(super) error: Option<KeyError>,
}

impl fmt::Debug for Plan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("key", self.key)
            .field("cost", &self.cost)
            .field("entries", &self.entries)
            .field("exempt", &self.exempt)
            .finish_non_exhaustive()
    }
}

impl<'a> Plan<'a> {
    pub(crate) fn new(names: &'a [Box<str>], key: &'a Key, cost: u64) -> Self {
        Self {
            names,
            key,
            cost,
            entries: SmallVec::new(),
            exempt: false,
            error: None,
        }
    }

    /// The layer's key for this request. When the key extractor found none, this is
    /// [`Key::Global`] standing in for it: the resolver runs so that it can
    /// [`exempt`](Plan::exempt) the request (a health check without an API key, say), and
    /// anything else it does is ignored; the request then fails with the key error.
    pub fn key(&self) -> &Key {
        self.key
    }

    /// The layer's cost for this request (units).
    pub fn cost(&self) -> u64 {
        self.cost
    }

    /// The layer's policy names, in the order they were added.
    pub fn policies(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(|n| &**n)
    }

    /// The layer's policy names, borrowed from the layer (not from the plan).
    pub(crate) fn names(&self) -> &'a [Box<str>] {
        self.names
    }

    /// Keeps only the charges whose policy index passes `keep`.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.entries.retain(|e| keep(e.index));
    }

    /// Charges the policy at `index` (already known to be valid).
    pub(crate) fn push(&mut self, index: u32, key: Option<Key>, cost: u64) {
        self.entries.push(Entry { index, key, cost });
    }

    fn index(&mut self, policy: &str) -> Option<u32> {
        let found = self
            .names
            .iter()
            .position(|n| &**n == policy)
            .and_then(|i| u32::try_from(i).ok());
        if found.is_none() {
            tracing::error!(policy, "rate-limit resolver named an unknown policy");
            self.error = Some(KeyError::Misconfigured(
                "rate-limit resolver named an unknown policy",
            ));
        }
        found
    }

    /// Charges `policy` with the layer's key and cost.
    pub fn charge(&mut self, policy: &str) -> &mut Self {
        if let Some(index) = self.index(policy) {
            self.entries.push(Entry {
                index,
                key: None,
                cost: self.cost,
            });
        }
        self
    }

    /// Charges `policy` with its own key and cost (units).
    pub fn charge_with(&mut self, policy: &str, key: Key, cost: u64) -> &mut Self {
        if let Some(index) = self.index(policy) {
            self.entries.push(Entry {
                index,
                key: Some(key),
                cost,
            });
        }
        self
    }

    /// Charges `policy` with the layer's key and its own cost (units).
    pub fn charge_cost(&mut self, policy: &str, cost: u64) -> &mut Self {
        if let Some(index) = self.index(policy) {
            self.entries.push(Entry {
                index,
                key: None,
                cost,
            });
        }
        self
    }

    /// Charges every policy with the layer's key and cost.
    pub fn charge_all(&mut self) -> &mut Self {
        let cost = self.cost;
        // A plain loop: SmallVec's `extend` sizes and re-checks more than one or two pushes.
        for i in 0..self.names.len() {
            if let Ok(index) = u32::try_from(i) {
                self.entries.push(Entry {
                    index,
                    key: None,
                    cost,
                });
            }
        }
        self
    }

    /// Exempts the request: no policy is charged and no headers are added.
    pub fn exempt(&mut self) -> &mut Self {
        self.exempt = true;
        self
    }

    /// Fails the request with `err` (`400` for [`KeyError::Missing`], `500` otherwise).
    pub fn fail(&mut self, err: KeyError) -> &mut Self {
        self.error = Some(err);
        self
    }

    /// The charges (repeated charges of one policy and key merged into one of the summed
    /// cost, see [`Plan`]), whether the request is exempt, and the resolver's error.
    pub(crate) fn finish(mut self) -> (SmallVec<[Entry; 2]>, bool, Option<KeyError>) {
        if self.entries.len() > 1 {
            merge_repeated(&mut self.entries, self.key);
        }
        (self.entries, self.exempt, self.error)
    }
}

/// Merges every charge of a policy and key already charged earlier in `entries` into that
/// earlier charge (the costs summed, saturating), keeping the first one's place. `key` is the
/// layer's key, which an entry without its own key stands for.
fn merge_repeated(entries: &mut SmallVec<[Entry; 2]>, key: &Key) {
    let mut i = 1;
    while i < entries.len() {
        let (head, tail) = entries.split_at_mut(i);
        let Some(e) = tail.first() else { break };
        let same = |f: &&mut Entry| {
            f.index == e.index && f.key.as_ref().unwrap_or(key) == e.key.as_ref().unwrap_or(key)
        };
        if let Some(first) = head.iter_mut().find(same) {
            first.cost = first.cost.saturating_add(e.cost);
            entries.remove(i);
        } else {
            i += 1;
        }
    }
}

/// The charges of an admitted (or checking) request, owned so they can be settled after the
/// response.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub(crate) key: Key,
    pub(crate) entries: SmallVec<[Entry; 2]>,
}

impl Default for Applied {
    fn default() -> Self {
        Self {
            key: Key::Global,
            entries: SmallVec::new(),
        }
    }
}

impl Applied {
    /// The store charges, in plan order.
    pub(crate) fn charges<'a>(&'a self, ids: &[PolicyId]) -> SmallVec<[Charge<'a, Key>; 2]> {
        let mut charges = SmallVec::new();
        for e in &self.entries {
            if let Some(&id) = ids.get(e.index as usize) {
                charges.push(Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost));
            }
        }
        charges
    }

    /// The only store charge, when there is exactly one (a single-policy layer, the usual
    /// case): checked from a one-element array, as collecting it into a `SmallVec` costs
    /// more than the store's lookup of it.
    #[inline]
    pub(crate) fn single_charge<'a>(&'a self, ids: &[PolicyId]) -> Option<Charge<'a, Key>> {
        let [e] = self.entries.as_slice() else {
            return None;
        };
        let &id = ids.get(e.index as usize)?;
        Some(Charge::new(id, e.key.as_ref().unwrap_or(&self.key), e.cost))
    }

    /// The policy index of each decision, in plan order, collected. One policy is written
    /// directly: collecting sizes and checks more than that one push (on every 429).
    pub(crate) fn policy_indices(&self) -> SmallVec<[usize; 2]> {
        match self.entries.as_slice() {
            [e] => SmallVec::from_buf_and_len([e.index as usize, 0], 1),
            entries => entries.iter().map(|e| e.index as usize).collect(),
        }
    }

    /// The policy index of each decision, in plan order.
    pub(crate) fn indices(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        self.entries.iter().map(|e| e.index as usize)
    }
}
