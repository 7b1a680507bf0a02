//! Priority partitions: which partition a request belongs to ([`Classify`]) and the
//! admission rule that keeps each partition's guaranteed share of the limit.

use http::Request;

use crate::RequestParts;

/// Puts a request into a partition, by name (see
/// [`AdaptiveConcurrencyBuilder::partition`](super::AdaptiveConcurrencyBuilder::partition)).
/// A name no partition has puts the request into the **last** declared partition (by
/// convention the lowest priority), so an unexpected request is shed first rather than
/// admitted with a guarantee.
///
/// Closures over a [`RequestParts`] returning a `&'static str` are classifiers:
///
/// ```
/// use ratekeeper_tower::RequestParts;
/// use ratekeeper_tower::adaptive::Classify;
///
/// let by_header = |req: &RequestParts<'_>| match req.headers().get("x-priority") {
///     Some(v) if v == "critical" => "critical",
///     _ => "sheddable",
/// };
/// let req = axum::http::Request::builder().header("x-priority", "critical").body(()).unwrap();
/// assert_eq!(by_header.classify(&req), "critical");
/// ```
pub trait Classify: Send + Sync + 'static {
    /// The partition name for `req`.
    fn classify<B>(&self, req: &Request<B>) -> &'static str;
}

impl<F> Classify for F
where
    F: Fn(&RequestParts<'_>) -> &'static str + Send + Sync + 'static,
{
    #[inline]
    fn classify<B>(&self, req: &Request<B>) -> &'static str {
        self(&RequestParts::new(req))
    }
}

/// The default classifier: every request in one partition (the last declared one, or the
/// implicit `"all"` partition when none is declared).
#[derive(Debug, Clone, Copy, Default)]
pub struct Unclassified;

impl Classify for Unclassified {
    #[inline]
    fn classify<B>(&self, _req: &Request<B>) -> &'static str {
        ""
    }
}

/// The declared partitions: names and guaranteed shares of the limit.
#[derive(Debug, Clone)]
pub(crate) struct Partitions {
    pub(crate) names: Box<[Box<str>]>,
    shares: Box<[f64]>,
}

impl Partitions {
    /// `(name, share)` pairs, already validated (shares in `(0, 1]`, sum at most 1).
    pub(crate) fn new(partitions: &[(Box<str>, f64)]) -> Self {
        if partitions.is_empty() {
            return Self {
                names: Box::new(["all".into()]),
                shares: Box::new([1.0]),
            };
        }
        Self {
            names: partitions.iter().map(|(n, _)| n.clone()).collect(),
            shares: partitions.iter().map(|&(_, s)| s).collect(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// The partition named `name`, or the last one.
    #[inline]
    pub(crate) fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| &**n == name)
            .unwrap_or(self.names.len() - 1)
    }

    /// The in-flight requests partition `p` may always have at `limit`: `share × limit`
    /// apportioned in whole requests by the largest remainder (Hamilton) method, so the
    /// guarantees add up to `floor(Σ shares × limit)` (the whole limit when the shares add
    /// up to 1) and each is `share × limit` rounded down or up: every partition gets its
    /// floor, and the slots left go to the largest fractional parts (ties: the partition
    /// declared first).
    pub(crate) fn guaranteed(&self, p: usize, limit: u32) -> u32 {
        let Some(&share) = self.shares.get(p) else {
            return 0;
        };
        let limit = f64::from(limit);
        let exact = |s: f64| s * limit;
        let sum: f64 = self.shares.iter().map(|&s| exact(s)).sum();
        let floors: f64 = self.shares.iter().map(|&s| exact(s).floor()).sum();
        // The shares add up to at most 1 (checked at build time); the epsilon absorbs
        // rounding in the sum (0.9 + 0.1 of 10 is 9.999...).
        let leftover = ((sum + 1e-9).floor() - floors).max(0.0) as usize;
        let mine = exact(share);
        let remainder = mine - mine.floor();
        let rank = self
            .shares
            .iter()
            .enumerate()
            .filter(|&(q, &s)| {
                let r = exact(s) - exact(s).floor();
                r > remainder || (r == remainder && q < p)
            })
            .count();
        mine.floor() as u32 + u32::from(rank < leftover)
    }
}

/// How long a partition's demand is remembered: its peak in flight over the current and
/// the previous period of this length (ns), so 1 to 2 s.
pub(crate) const DEMAND_PERIOD_NS: u64 = 1_000_000_000;

/// Requests in flight, in total and per partition, and each partition's recent demand.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    pub(crate) total: u32,
    pub(crate) by_partition: Box<[u32]>,
    /// Per partition: the most in flight in the current demand period...
    peak: Box<[u32]>,
    /// ...and in the previous one.
    previous_peak: Box<[u32]>,
    period_start: u64,
}

impl InFlight {
    pub(crate) fn new(partitions: usize) -> Self {
        Self {
            total: 0,
            by_partition: vec![0; partitions].into_boxed_slice(),
            peak: vec![0; partitions].into_boxed_slice(),
            previous_peak: vec![0; partitions].into_boxed_slice(),
            period_start: 0,
        }
    }

    /// Admits a request of partition `p` at `limit` at `now` (ns), counting it, or refuses
    /// it.
    ///
    /// A partition below its guaranteed share is always admitted (the rule of Netflix
    /// concurrency-limits' partitioned limiter), even at the limit: so under overload every
    /// partition keeps its share, and what another partition borrowed is taken back as its
    /// requests complete. The requests in flight can then exceed the limit by at most the
    /// shares being reclaimed, never by more than the limit.
    ///
    /// A partition at or above its share may borrow free slots below the limit, except the
    /// slots other partitions with recent demand are owed: for each other partition, its
    /// share or its peak in flight over the last 1 to 2 s, whichever is smaller, minus what
    /// it has in flight. Without that reservation (Netflix's rule) a borrower whose requests
    /// arrive as often as the owner's takes half of every slot that frees up, and the owner
    /// falls short of its share for as long as the overload lasts; with it, an idle
    /// partition's share is still lent out in full.
    pub(crate) fn try_admit(
        &mut self,
        p: usize,
        limit: u32,
        partitions: &Partitions,
        now: u64,
    ) -> bool {
        self.roll(now);
        let Some(mine) = self.by_partition.get(p).copied() else {
            return false;
        };
        let admit = if mine < partitions.guaranteed(p, limit) {
            true
        } else {
            let owed: u32 = (0..self.by_partition.len())
                .filter(|&q| q != p)
                .map(|q| {
                    let demand = self.peak[q].max(self.previous_peak[q]);
                    partitions
                        .guaranteed(q, limit)
                        .min(demand)
                        .saturating_sub(self.by_partition[q])
                })
                .fold(0u32, u32::saturating_add);
            self.total.saturating_add(owed) < limit
        };
        if admit {
            self.total += 1;
            self.by_partition[p] = mine + 1;
            self.peak[p] = self.peak[p].max(mine + 1);
        }
        admit
    }

    /// Starts a new demand period when the current one is over.
    fn roll(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.period_start);
        if elapsed < DEMAND_PERIOD_NS {
            return;
        }
        if elapsed >= 2 * DEMAND_PERIOD_NS {
            // A whole period without requests: no recent demand at all.
            self.previous_peak.copy_from_slice(&self.by_partition);
        } else {
            self.previous_peak.copy_from_slice(&self.peak);
        }
        self.peak.copy_from_slice(&self.by_partition);
        self.period_start = now;
    }

    /// One request of partition `p` has finished.
    pub(crate) fn release(&mut self, p: usize) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.by_partition.get_mut(p) {
            *n = n.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn critical_sheddable() -> Partitions {
        Partitions::new(&[("critical".into(), 0.9), ("sheddable".into(), 0.1)])
    }

    #[test]
    fn unknown_names_fall_into_the_last_partition() {
        let p = critical_sheddable();
        assert_eq!(p.index("critical"), 0);
        assert_eq!(p.index("sheddable"), 1);
        assert_eq!(p.index("batch"), 1);
        assert_eq!(Partitions::new(&[]).index(""), 0);
    }

    #[test]
    fn shares_are_apportioned_by_largest_remainder() {
        let p = critical_sheddable();
        let at = |limit| (p.guaranteed(0, limit), p.guaranteed(1, limit));
        assert_eq!(at(22), (20, 2));
        assert_eq!(at(11), (10, 1));
        assert_eq!(at(10), (9, 1));
        assert_eq!(at(3), (3, 0));
        let halves = Partitions::new(&[("a".into(), 0.5), ("b".into(), 0.5)]);
        assert_eq!((halves.guaranteed(0, 3), halves.guaranteed(1, 3)), (2, 1));
        let partial = Partitions::new(&[("a".into(), 0.45), ("b".into(), 0.45)]);
        assert_eq!(
            (partial.guaranteed(0, 10), partial.guaranteed(1, 10)),
            (5, 4)
        );
        assert_eq!(Partitions::new(&[]).guaranteed(0, 7), 7);
        assert_eq!(p.guaranteed(5, 7), 0);
    }

    #[test]
    fn a_full_borrower_cannot_keep_critical_out() {
        let p = critical_sheddable();
        let mut f = InFlight::new(2);
        // Sheddable traffic alone takes every slot of a limit of 20.
        for _ in 0..20 {
            assert!(f.try_admit(1, 20, &p, 0));
        }
        assert!(!f.try_admit(1, 20, &p, 0));
        // Critical still gets its 18 at once.
        for _ in 0..18 {
            assert!(f.try_admit(0, 20, &p, 0));
        }
        assert!(!f.try_admit(0, 20, &p, 0));
        assert_eq!(f.total, 38);
        // Sheddable requests that finish are not replaced until it is back under its share.
        for _ in 0..18 {
            f.release(1);
            assert!(!f.try_admit(1, 20, &p, 0));
        }
        f.release(1);
        assert!(f.try_admit(1, 20, &p, 0));
    }

    #[test]
    fn a_borrower_takes_no_slot_a_busy_partition_is_owed() {
        let p = critical_sheddable();
        let mut f = InFlight::new(2);
        // Critical traffic at its share (18 of 20): its demand is known.
        for _ in 0..18 {
            assert!(f.try_admit(0, 20, &p, 0));
        }
        for _ in 0..2 {
            assert!(f.try_admit(1, 20, &p, 0));
        }
        // A critical request completes: the free slot is critical's, not sheddable's.
        f.release(0);
        assert!(!f.try_admit(1, 20, &p, 1));
        assert!(f.try_admit(0, 20, &p, 2));
        // After two quiet seconds critical has no recent demand: its share is lent out.
        for _ in 0..18 {
            f.release(0);
        }
        assert!(f.try_admit(1, 20, &p, 3 * DEMAND_PERIOD_NS));
        for _ in 0..17 {
            assert!(f.try_admit(1, 20, &p, 3 * DEMAND_PERIOD_NS));
        }
        assert_eq!(f.by_partition[1], 20);
    }

    proptest! {
        /// Under overload (both partitions always have requests waiting, arriving in a
        /// random order, completing in a random order), each partition keeps at least its
        /// guaranteed share in flight, once the other's demand is known never takes a slot
        /// the other is owed (at most `limit - guaranteed(other)` in flight), and the total
        /// exceeds the limit by at most the borrowed requests still in flight (the shares
        /// being reclaimed), never by more than the limit.
        #[test]
        fn partitions_keep_their_shares(
            limit in 1u32..200,
            a in 1u32..=100,
            steps in proptest::collection::vec((0usize..2, any::<u32>()), 1..2000),
        ) {
            let share_a = f64::from(a) / 100.0;
            let parts = Partitions::new(&[("a".into(), share_a), ("b".into(), 1.0 - share_a)]);
            let mut f = InFlight::new(2);
            // In flight, by partition, in admission order.
            let mut running: Vec<usize> = Vec::new();
            for (step, (p, pick)) in steps.into_iter().enumerate() {
                let now = step as u64 * 1_000_000;
                // Arrivals of both partitions take every slot they may, in a random order.
                for q in [p, 1 - p] {
                    while f.try_admit(q, limit, &parts, now) {
                        running.push(q);
                        // From the second step on, both partitions' demand is known.
                        let other = parts.guaranteed(1 - q, limit);
                        prop_assert!(
                            step == 0
                                || f.by_partition[q]
                                    <= (limit - other).max(parts.guaranteed(q, limit)),
                            "partition {} took its slot {} of {}, the other is owed {}",
                            q, f.by_partition[q], limit, other
                        );
                    }
                }
                // The documented bound: beyond the limit only by the shares being reclaimed
                // (the requests borrowed beyond a partition's share, still in flight),
                // never by more than the limit.
                let borrowed: u32 = (0..2)
                    .map(|q| f.by_partition[q].saturating_sub(parts.guaranteed(q, limit)))
                    .sum();
                prop_assert!(
                    f.total <= limit + borrowed.min(limit),
                    "{} in flight at limit {} with {} borrowed",
                    f.total, limit, borrowed
                );
                for q in 0..2 {
                    prop_assert!(f.by_partition[q] >= parts.guaranteed(q, limit));
                }
                // One random request completes.
                if !running.is_empty() {
                    let i = pick as usize % running.len();
                    let q = running.swap_remove(i);
                    f.release(q);
                }
            }
            prop_assert_eq!(f.total as usize, running.len());
        }
    }
}
