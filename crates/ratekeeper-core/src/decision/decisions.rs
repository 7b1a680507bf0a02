//! [`Decisions`]: the decisions of one store call, in charge order, with their receipts.

use smallvec::SmallVec;

use super::Receipt;
use crate::Decision;
use crate::clock::nanos;

/// The decisions for a list of charges, in the same order.
///
/// One policy (the usual layer) is kept inline: the answer is 56 bytes, with no heap and
/// nothing to drop. Two policies take one heap block, three and more two.
///
/// An answer of [`Store::reserve`] also carries the reservation: [`Decisions::delay`] (how
/// long an allowed, already charged request waits before it proceeds) and
/// [`Decisions::is_final`] (a denial that waiting within `max_wait` cannot change).
///
/// Each allowed decision comes with the [`Receipt`] of what its charge took
/// ([`Decisions::receipts`]); equality compares the decisions, the delay and finality, not
/// the receipts (whose stamps are in each store's own time unit).
///
/// [`Store::reserve`]: crate::store::Store::reserve
#[derive(Debug, Clone)]
pub struct Decisions {
    items: Items,
    /// The reservation delay in ns (see [`Decisions::delay`]).
    delay_ns: u64,
    is_final: bool,
}

/// The decisions and receipts of an answer. One policy (the usual layer) is kept inline, so
/// the answer of a one-policy check is 56 bytes with no heap and no drop work; two take one
/// heap block; zero or three and more two boxed slices (an empty one does not allocate, so
/// no policy, or decisions without receipts, take less). Keeping two inline too would make
/// every answer 96 bytes, and its copies cost the one-policy check more than the block
/// costs two policies (measured in `BENCHMARKS.md`, "Figures behind statements in the API
/// docs").
#[derive(Debug, Clone)]
enum Items {
    One(Receipt, [Decision; 1]),
    /// Two policies (a per-second and a per-minute limit, say): one heap block.
    Two(Box<([Decision; 2], [Receipt; 2])>),
    Many(Box<[Decision]>, Box<[Receipt]>),
}

impl Default for Decisions {
    fn default() -> Self {
        Self::from_items(Items::Many(Box::default(), Box::default()))
    }
}

impl PartialEq for Decisions {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
            && self.delay_ns == other.delay_ns
            && self.is_final == other.is_final
    }
}
impl Eq for Decisions {}

impl Decisions {
    #[inline]
    const fn from_items(items: Items) -> Self {
        Self {
            items,
            delay_ns: 0,
            is_final: false,
        }
    }

    /// Wraps decisions given in charge order.
    pub fn new(items: impl IntoIterator<Item = Decision>) -> Self {
        let items: SmallVec<[Decision; 4]> = items.into_iter().collect();
        match items.as_slice() {
            [] => Self::default(),
            [one] => Self::one(*one),
            [a, b] => Self::from_items(Items::Two(Box::new(([*a, *b], [Receipt::NONE; 2])))),
            // No receipts: an empty slice, which reads as `Receipt::NONE` and allocates nothing.
            many => Self::from_items(Items::Many(many.into(), Box::default())),
        }
    }

    /// Wraps decisions given in charge order, each with its charge's [`Receipt`]
    /// ([`Receipt::NONE`] for a denial).
    pub fn with_receipts(items: impl IntoIterator<Item = (Decision, Receipt)>) -> Self {
        let items: SmallVec<[(Decision, Receipt); 4]> = items.into_iter().collect();
        match items.as_slice() {
            [] => Self::default(),
            [(one, receipt)] => Self::one_with_receipt(*one, *receipt),
            [(a, ra), (b, rb)] => Self::from_items(Items::Two(Box::new(([*a, *b], [*ra, *rb])))),
            many => {
                let receipts = if many.iter().all(|(_, r)| *r == Receipt::NONE) {
                    Box::default()
                } else {
                    many.iter().map(|(_, r)| *r).collect()
                };
                let decisions = many.iter().map(|(d, _)| *d).collect();
                Self::from_items(Items::Many(decisions, receipts))
            }
        }
    }

    /// The decision of a single policy (cheaper than [`Decisions::new`] with one item).
    #[inline]
    pub fn one(decision: Decision) -> Self {
        Self::one_with_receipt(decision, Receipt::NONE)
    }

    /// The decision of a single policy with its charge's [`Receipt`].
    #[inline]
    pub fn one_with_receipt(decision: Decision, receipt: Receipt) -> Self {
        Self::from_items(Items::One(receipt, [decision]))
    }

    /// The receipt of the charge behind decision `i` ([`Receipt::NONE`] when it was denied,
    /// took nothing, or the store gave no receipt).
    #[inline]
    pub fn receipt(&self, i: usize) -> Receipt {
        let receipt = match &self.items {
            Items::One(receipt, _) => (i == 0).then_some(*receipt),
            Items::Two(two) => two.1.get(i).copied(),
            Items::Many(_, receipts) => receipts.get(i).copied(),
        };
        if self.as_slice().get(i).is_some_and(Decision::is_allowed) {
            receipt.unwrap_or_default()
        } else {
            Receipt::NONE
        }
    }

    /// The receipts, in charge order (see [`Decisions::receipt`]).
    pub fn receipts(&self) -> impl Iterator<Item = Receipt> + '_ {
        (0..self.len()).map(|i| self.receipt(i))
    }

    /// Sets the reservation delay (see [`Decisions::delay`]).
    #[must_use]
    pub const fn with_delay(mut self, delay: std::time::Duration) -> Self {
        // Saturates at u64::MAX ns, about 584 years.
        self.delay_ns = nanos(delay);
        self
    }

    /// Marks a denial as final (see [`Decisions::is_final`]).
    #[must_use]
    pub const fn with_final(mut self, is_final: bool) -> Self {
        self.is_final = is_final;
        self
    }

    /// For an allowed answer of [`Store::reserve`]: how long the request waits before it
    /// proceeds. Every policy is already charged; the caller must not check again, and must
    /// [`Store::refund`] the charges if the request is dropped before it proceeds.
    /// [`Duration::ZERO`](std::time::Duration::ZERO) for "allowed now" and for every answer
    /// of [`Store::check`].
    ///
    /// [`Store::reserve`]: crate::store::Store::reserve
    /// [`Store::refund`]: crate::store::Store::refund
    /// [`Store::check`]: crate::store::Store::check
    #[inline]
    pub const fn delay(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.delay_ns)
    }

    /// For a denied answer of [`Store::reserve`]: whether the store reserved exactly and no
    /// wait within `max_wait` can admit the request, so the caller rejects at once instead of
    /// retrying after `retry_after`. `false` for [`Store::check`] answers and for stores
    /// (or algorithms) that cannot reserve, whose callers fall back to check-and-retry.
    ///
    /// [`Store::reserve`]: crate::store::Store::reserve
    /// [`Store::check`]: crate::store::Store::check
    #[inline]
    pub const fn is_final(&self) -> bool {
        self.is_final
    }

    /// Whether every policy allowed (and so every policy was charged).
    #[inline]
    pub fn is_allowed(&self) -> bool {
        match &self.items {
            Items::One(_, [one]) => one.is_allowed(),
            Items::Two(two) => two.0.iter().all(Decision::is_allowed),
            Items::Many(items, _) => items.iter().all(Decision::is_allowed),
        }
    }

    /// Whether some decision started a [`Ban`](crate::Ban) ([`Decision::starts_ban`]).
    #[inline]
    pub fn starts_ban(&self) -> bool {
        self.as_slice().iter().any(Decision::starts_ban)
    }

    /// Whether some policy said the cost can never fit.
    #[inline]
    pub fn is_cannot_fit(&self) -> bool {
        self.as_slice().iter().any(Decision::is_cannot_fit)
    }

    /// The decisions, in charge order.
    #[inline]
    pub fn as_slice(&self) -> &[Decision] {
        match &self.items {
            Items::One(_, one) => one,
            Items::Two(two) => &two.0,
            Items::Many(items, _) => items,
        }
    }

    /// The number of decisions.
    #[inline]
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// Whether there are no decisions (no policy applied).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.as_slice().is_empty()
    }

    /// Time until the whole request would pass: the longest `retry_after` among the denials.
    /// `None` when allowed or when the cost can never fit.
    #[inline]
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        if self.is_cannot_fit() {
            return None;
        }
        self.as_slice()
            .iter()
            .filter_map(Decision::retry_after)
            .max()
    }

    /// The index of the decision that headers report: when denied, the denial that lasts
    /// longest (a "cannot fit" first); when allowed, the policy closest to exhaustion
    /// (fewest remaining, then the longest reset).
    #[inline]
    pub fn deciding(&self) -> Option<usize> {
        // One policy (the usual layer): its decision is the one, whatever it says.
        let items: &[Decision] = match &self.items {
            Items::One(..) => return Some(0),
            Items::Two(two) => &two.0,
            Items::Many(items, _) => items,
        };
        if let Some(i) = items.iter().position(Decision::is_cannot_fit) {
            return Some(i);
        }
        if self.is_allowed() {
            items
                .iter()
                .enumerate()
                .min_by(|(_, a), (_, b)| {
                    a.remaining()
                        .cmp(&b.remaining())
                        .then(b.reset_after().cmp(&a.reset_after()))
                })
                .map(|(i, _)| i)
        } else {
            items
                .iter()
                .enumerate()
                .filter(|(_, d)| d.is_denied())
                .max_by_key(|(_, d)| d.retry_after())
                .map(|(i, _)| i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn allowed(remaining: u32) -> Decision {
        Decision::new(
            crate::Outcome::Allowed,
            10,
            remaining,
            Duration::from_secs(1),
        )
    }

    fn denied(secs: u64) -> Decision {
        let retry_after = Duration::from_secs(secs);
        Decision::new(crate::Outcome::Denied { retry_after }, 10, 0, retry_after)
    }

    #[test]
    fn one_policy_is_inline_in_56_bytes() {
        assert_eq!(std::mem::size_of::<Decisions>(), 56);
        let one = Decisions::one_with_receipt(allowed(3), Receipt::new(7));
        assert_eq!(one.as_slice(), &[allowed(3)]);
        assert_eq!(one.receipt(0), Receipt::new(7));
        assert_eq!(one.receipt(1), Receipt::NONE);
        assert!(one.is_allowed());
        assert_eq!(one.deciding(), Some(0));
        // Built from a list of one, it is the same answer.
        assert_eq!(
            Decisions::with_receipts([(allowed(3), Receipt::new(7))]),
            one
        );
    }

    #[test]
    fn several_and_no_policies() {
        let none = Decisions::default();
        assert!(none.is_empty() && none.is_allowed());
        assert_eq!(none.deciding(), None);
        assert_eq!(none.receipts().count(), 0);

        let two =
            Decisions::with_receipts([(allowed(5), Receipt::new(1)), (denied(2), Receipt::new(2))]);
        assert_eq!(two.len(), 2);
        assert!(!two.is_allowed());
        assert_eq!(two.deciding(), Some(1));
        assert_eq!(two.retry_after(), Some(Duration::from_secs(2)));
        // A denial holds no receipt, whatever the store gave.
        let receipts: Vec<_> = two.receipts().collect();
        assert_eq!(receipts, [Receipt::new(1), Receipt::NONE]);

        let three = Decisions::with_receipts([
            (allowed(5), Receipt::new(1)),
            (allowed(2), Receipt::new(2)),
            (allowed(7), Receipt::new(3)),
        ]);
        assert_eq!(three.as_slice(), &[allowed(5), allowed(2), allowed(7)]);
        assert!(three.is_allowed());
        assert_eq!(three.deciding(), Some(1));
        let receipts: Vec<_> = three.receipts().collect();
        assert_eq!(
            receipts,
            [Receipt::new(1), Receipt::new(2), Receipt::new(3)]
        );
        assert_eq!(
            Decisions::new([allowed(1), allowed(1)]).receipt(1),
            Receipt::NONE
        );
        // Without receipts (no heap slice for them), three read as with `Receipt::NONE`.
        let bare = Decisions::new([allowed(1), denied(1), allowed(2)]);
        assert!(bare.receipts().all(|r| r == Receipt::NONE));
        assert_eq!(bare.deciding(), Some(1));
        let none = [allowed(1), denied(1), allowed(2)].map(|d| (d, Receipt::NONE));
        assert_eq!(bare, Decisions::with_receipts(none));

        let delayed = two.clone().with_delay(Duration::MAX);
        assert_eq!(delayed.delay(), Duration::from_nanos(u64::MAX));
        assert_ne!(delayed, two);
    }
}
