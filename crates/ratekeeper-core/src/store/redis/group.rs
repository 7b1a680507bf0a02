//! A group of charges: one client key, one hash tag, one script call. The key names in one
//! buffer, each charge's script parameters and receipt stamp, and the group's bans.

use smallvec::SmallVec;

use super::keys;
use super::policy::RedisPolicy;
use super::protocol::{STAMP_DEBIT, STAMP_NONE};
use crate::Key;
use crate::store::Receipt;

/// A group of charges sharing one client key (one hash tag, one script call).
#[derive(Debug, Clone, Default)]
pub(super) struct Group {
    /// The full key names, one after the other (each charge's `end` says where its name
    /// ends): one buffer for the group.
    pub(super) names: String,
    pub(super) charges: SmallVec<[GroupCharge; 1]>,
    /// The bans of the group's policies that have one: the charge's position in the group
    /// (from 1, as the script counts), the ban key, and the ban (see [`RedisPolicy::ban`]).
    /// Empty (no allocation) for policies without a ban.
    pub(super) bans: Vec<(usize, String, [u64; 3])>,
}

/// One charge of a [`Group`].
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupCharge {
    /// Where its key name ends in [`Group::names`].
    end: usize,
    /// Algorithm code, three parameters, cost.
    pub(super) params: [u64; 5],
    /// The receipt stamp a refund gives back ([`STAMP_NONE`]: none; [`STAMP_DEBIT`]: a
    /// correction's extra charge; in a reservation, how the policy reserves).
    pub(super) stamp: i64,
    /// The capacity (the most `remaining` can be).
    pub(super) capacity: u32,
    /// The limit reported.
    pub(super) limit: u32,
    /// Index of the charge in the request.
    slot: usize,
}

/// The charges of one request split by client key: one group (one script call) per key.
pub(super) type Groups = SmallVec<[Group; 1]>;

impl Group {
    /// Adds the charge `slot` of the request: `policy` for client `key`, whose name is
    /// `<prefix>:v2:{<tag>}:<policy>` (see `keys`).
    pub(super) fn push(
        &mut self,
        prefix: &str,
        key: &Key,
        policy: &RedisPolicy,
        cost: u64,
        receipt: Receipt,
        slot: usize,
    ) {
        if self.names.capacity() == 0 {
            // Room for the usual name, so one allocation holds it.
            self.names
                .reserve(prefix.len() + policy.name.len() + keys::VERSION.len() + 48);
        }
        keys::push_full(&mut self.names, prefix, key, &policy.name);
        let [p1, p2, p3] = policy.params;
        if let Some(ban) = policy.ban {
            let start = self.charges.last().map_or(0, |c| c.end);
            let full = self.names.get(start..).unwrap_or_default();
            self.bans.push((
                self.charges.len() + 1,
                super::keys::ban(full, &policy.name),
                ban,
            ));
        }
        self.charges.push(GroupCharge {
            end: self.names.len(),
            params: [policy.algo, p1, p2, p3, cost],
            stamp: stamp_of(receipt),
            capacity: policy.capacity,
            limit: policy.limit,
            slot,
        });
    }

    /// The same charges, to be given back with `receipts` (one per key, in order).
    pub(super) fn refund_of(&self, receipts: impl IntoIterator<Item = Receipt>) -> Self {
        let mut refund = self.clone();
        for (charge, receipt) in refund.charges.iter_mut().zip(receipts) {
            charge.stamp = stamp_of(receipt);
        }
        refund
    }

    /// Marks the keys whose charge index in the request passes `is_debit` as extra charges
    /// of a [`Mode::Correct`](super::script::Mode::Correct) call (their cost is charged without refusing; the others give
    /// back their cost by their receipt).
    pub(super) fn mark_debits(&mut self, is_debit: impl Fn(usize) -> bool) {
        for charge in &mut self.charges {
            if is_debit(charge.slot) {
                charge.stamp = STAMP_DEBIT;
            }
        }
    }

    /// The number of charges.
    pub(super) fn len(&self) -> usize {
        self.charges.len()
    }

    /// The index in the request of each charge, in order.
    pub(super) fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.charges.iter().map(|c| c.slot)
    }

    /// The full key names, in order.
    pub(super) fn names(&self) -> impl Iterator<Item = &str> + '_ {
        let mut start = 0;
        self.charges.iter().map(move |c| {
            let name = self.names.get(start..c.end).unwrap_or_default();
            start = c.end;
            name
        })
    }
}

/// A receipt as the script's stamp argument ([`STAMP_NONE`]: none).
fn stamp_of(receipt: Receipt) -> i64 {
    receipt
        .stamp()
        .map_or(STAMP_NONE, |s| i64::try_from(s).unwrap_or(i64::MAX))
}
