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
/// use ratekeeper_axum::RequestParts;
/// use ratekeeper_axum::adaptive::Classify;
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

    /// The in-flight requests partition `p` may always have at `limit`:
    /// `floor(share × limit)`.
    pub(crate) fn guaranteed(&self, p: usize, limit: u32) -> u32 {
        let share = self.shares.get(p).copied().unwrap_or(0.0);
        (share * f64::from(limit)).floor() as u32
    }
}

/// Requests in flight, in total and per partition.
#[derive(Debug, Clone)]
pub(crate) struct InFlight {
    pub(crate) total: u32,
    pub(crate) by_partition: Box<[u32]>,
}

impl InFlight {
    pub(crate) fn new(partitions: usize) -> Self {
        Self {
            total: 0,
            by_partition: vec![0; partitions].into_boxed_slice(),
        }
    }

    /// Admits a request of partition `p` at `limit`, counting it, or refuses it.
    ///
    /// The rule of Netflix concurrency-limits' partitioned limiter: below the limit anyone
    /// is admitted (a partition may borrow what others leave unused); at or above it, only
    /// a partition below its guaranteed share. So under overload every partition keeps its
    /// share, and what a partition borrowed is taken back as its requests complete. The
    /// total can exceed the limit by at most the sum of the shares (what partitions reclaim
    /// at once from a borrower), never by more than the limit.
    pub(crate) fn try_admit(&mut self, p: usize, limit: u32, partitions: &Partitions) -> bool {
        let Some(mine) = self.by_partition.get(p).copied() else {
            return false;
        };
        let admit = self.total < limit || mine < partitions.guaranteed(p, limit);
        if admit {
            self.total += 1;
            self.by_partition[p] = mine + 1;
        }
        admit
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
    fn a_full_borrower_cannot_keep_critical_out() {
        let p = critical_sheddable();
        let mut f = InFlight::new(2);
        // Sheddable traffic alone takes every slot of a limit of 20.
        for _ in 0..20 {
            assert!(f.try_admit(1, 20, &p));
        }
        assert!(!f.try_admit(1, 20, &p));
        // Critical still gets its 18 at once.
        for _ in 0..18 {
            assert!(f.try_admit(0, 20, &p));
        }
        assert!(!f.try_admit(0, 20, &p));
        assert_eq!(f.total, 38);
        // Sheddable requests that finish are not replaced until it is back under its share.
        for _ in 0..18 {
            f.release(1);
            assert!(!f.try_admit(1, 20, &p));
        }
        f.release(1);
        assert!(f.try_admit(1, 20, &p));
    }

    proptest! {
        /// Under overload (every partition always has requests waiting, served in a random
        /// order, completing in a random order), each partition ends with at least its
        /// guaranteed share in flight, and the total never exceeds twice the limit.
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
            for (p, pick) in steps {
                // Arrivals of both partitions fill every slot they may take.
                for q in [p, 1 - p] {
                    while f.try_admit(q, limit, &parts) {
                        running.push(q);
                    }
                }
                prop_assert!(f.total <= 2 * limit);
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
