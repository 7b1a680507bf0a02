//! [`Decision`]: what a limiter answers for one request against one policy.

pub(crate) mod decisions;
pub(crate) mod receipt;

pub(crate) use receipt::Receipt;

use std::fmt;
use std::time::Duration;

use crate::clock::nanos;

/// Allowed, denied for now, or never satisfiable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The request passes; its cost was charged.
    Allowed,
    /// The request is denied now and charged nothing; the same request passes after
    /// `retry_after`.
    Denied {
        /// Exact time until the same request (same cost) would pass.
        retry_after: Duration,
    },
    /// The cost is larger than the burst: it can never pass. Nothing was charged.
    CannotFit,
}

/// One policy's answer for one request.
///
/// A `Decision` carries everything the response headers need: the policy's `limit`, the
/// whole cost-1 requests still `remaining` (never negative), `reset_after` (time until the
/// key's state is back to "as if absent") and, for a denial, the exact `retry_after`.
/// "Denied now" ([`Outcome::Denied`]) and "can never fit" ([`Outcome::CannotFit`], cost larger
/// than the burst) are different outcomes: the second has no retry time.
///
/// A store answers a list of charges with [`Decisions`](crate::store::Decisions) (one
/// [`Decision`] per charge, in charge order), each allowed charge with the
/// [`Receipt`](crate::store::Receipt) of what it took, so that a refund gives back only that.
/// The algorithms produce these values; the stores pass them on (both are in
/// `ratekeeper_core::store`).
///
/// 32 bytes: durations are kept as whole nanoseconds (`u64`, saturating at about 584 years),
/// so an answer of two policies stays small enough to be returned by value cheaply.
///
/// # Example
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use ratekeeper_core::algorithm::Gcra;
/// use ratekeeper_core::Quota;
///
/// let gcra = Gcra::new(&Quota::per_minute(NonZeroU32::new(10).unwrap()));
/// let (decision, tat) = gcra.decide(0, 0, 1);
/// assert!(decision.is_allowed());
/// assert_eq!(decision.remaining(), 9);
/// assert_eq!(decision.reset_after(), Duration::from_secs(6));
/// assert_eq!(tat, Some(6_000_000_000));
///
/// let (never, _) = gcra.decide(0, 0, 11);
/// assert!(never.is_cannot_fit());
/// assert_eq!(never.retry_after(), None);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// `retry_after` of a denial in ns (0 for the other outcomes).
    retry_after_ns: u64,
    reset_after_ns: u64,
    limit: u32,
    remaining: u32,
    kind: Kind,
}

/// The outcome's kind, a full word wide: a `Decision` then has no padding, so it moves as
/// four whole words (with a 1-byte tag and 7 bytes of padding, moves copied the padding in
/// odd-sized pieces that stall store-to-load forwarding).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u64)]
enum Kind {
    Allowed,
    Denied,
    CannotFit,
    /// Denied by a ban in force (see [`crate::Ban`]).
    Banned,
    /// Denied, and this refusal started a ban.
    BanStarted,
}

impl Decision {
    /// Builds a decision. `remaining` is whole cost-1 requests that would pass now.
    /// Durations are kept in whole ns, saturating at `u64::MAX` ns (about 584 years).
    pub const fn new(outcome: Outcome, limit: u32, remaining: u32, reset_after: Duration) -> Self {
        let (kind, retry_after_ns) = match outcome {
            Outcome::Allowed => (Kind::Allowed, 0),
            Outcome::CannotFit => (Kind::CannotFit, 0),
            Outcome::Denied { retry_after } => (Kind::Denied, nanos(retry_after)),
        };
        Self {
            retry_after_ns,
            kind,
            reset_after_ns: nanos(reset_after),
            limit,
            remaining,
        }
    }

    /// [`Decision::new`] with `reset_after` in ns (the algorithms' unit), skipping the
    /// round trip through [`Duration`].
    #[inline]
    pub(crate) const fn with_reset_ns(
        outcome: Outcome,
        limit: u32,
        remaining: u32,
        reset_after_ns: u64,
    ) -> Self {
        let mut d = Self::new(outcome, limit, remaining, Duration::ZERO);
        d.reset_after_ns = reset_after_ns;
        d
    }

    /// An allowed decision with `reset_after` in ns (the algorithms' fast paths).
    #[inline(always)]
    pub(crate) const fn allowed_ns(limit: u32, remaining: u32, reset_after_ns: u64) -> Self {
        Self {
            retry_after_ns: 0,
            reset_after_ns,
            limit,
            remaining,
            kind: Kind::Allowed,
        }
    }

    /// A denial with `retry_after` and `reset_after` in ns (the algorithms' fast paths).
    #[inline(always)]
    pub(crate) const fn denied_ns(
        retry_after_ns: u64,
        limit: u32,
        remaining: u32,
        reset_after_ns: u64,
    ) -> Self {
        Self {
            retry_after_ns,
            reset_after_ns,
            limit,
            remaining,
            kind: Kind::Denied,
        }
    }

    /// The outcome.
    #[inline]
    pub const fn outcome(&self) -> Outcome {
        match self.kind {
            Kind::Allowed => Outcome::Allowed,
            Kind::CannotFit => Outcome::CannotFit,
            Kind::Denied | Kind::Banned | Kind::BanStarted => Outcome::Denied {
                retry_after: Duration::from_nanos(self.retry_after_ns),
            },
        }
    }

    /// A denial by a [`Ban`](crate::Ban) in force that ends in `ends_in`: `retry_after` and
    /// `reset_after` are `ends_in` (saturating at `u64::MAX` ns), `remaining` is 0.
    pub const fn banned(limit: u32, ends_in: Duration) -> Self {
        let ns = nanos(ends_in);
        Self {
            retry_after_ns: ns,
            reset_after_ns: ns,
            limit,
            remaining: 0,
            kind: Kind::Banned,
        }
    }

    /// The same decision marked as the refusal that started a ban (see
    /// [`Decision::starts_ban`]); a decision that allows or can never fit stays as it is.
    #[must_use]
    pub const fn with_ban_started(mut self) -> Self {
        if matches!(self.kind, Kind::Denied | Kind::Banned) {
            self.kind = Kind::BanStarted;
        }
        self
    }

    /// Whether the denial comes from a [`Ban`](crate::Ban): one in force, or the one this
    /// refusal started.
    #[inline]
    pub const fn is_banned(&self) -> bool {
        matches!(self.kind, Kind::Banned | Kind::BanStarted)
    }

    /// Whether this refusal started a [`Ban`](crate::Ban): true for exactly one decision per
    /// ban (a store reports the start once; later refusals of the ban are
    /// [`Decision::is_banned`] only), so it is what to count and log a ban by.
    #[inline]
    pub const fn starts_ban(&self) -> bool {
        matches!(self.kind, Kind::BanStarted)
    }

    /// Whether the request passes.
    #[inline]
    pub const fn is_allowed(&self) -> bool {
        matches!(self.kind, Kind::Allowed)
    }

    /// Whether the request is refused (for now or for ever).
    #[inline]
    pub const fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Whether the cost is larger than the burst, so the request can never pass.
    #[inline]
    pub const fn is_cannot_fit(&self) -> bool {
        matches!(self.kind, Kind::CannotFit)
    }

    /// For [`Outcome::Denied`], the exact time until the same request would pass.
    #[inline]
    pub const fn retry_after(&self) -> Option<Duration> {
        match self.outcome() {
            Outcome::Denied { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// The policy's limit (units per period).
    #[inline]
    pub const fn limit(&self) -> u32 {
        self.limit
    }

    /// Whole cost-1 requests that would pass right now (after this request, if allowed).
    #[inline]
    pub const fn remaining(&self) -> u32 {
        self.remaining
    }

    /// Time until the key's state is back to "as if absent" (bucket full, window over).
    #[inline]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }
}

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Decision");
        d.field("outcome", &self.outcome())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("reset_after", &self.reset_after());
        match self.kind {
            Kind::Banned => d.field("ban", &"in force"),
            Kind::BanStarted => d.field("ban", &"started"),
            _ => &mut d,
        }
        .finish()
    }
}

/// Rounds a duration up to whole seconds, as `Retry-After` and reset headers need
/// (RFC 9110 §10.2.3 delay-seconds). Sub-second durations round up to 1; zero stays 0.
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_core::ceil_secs;
/// assert_eq!(ceil_secs(Duration::from_millis(5_800)), 6);
/// assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
/// assert_eq!(ceil_secs(Duration::ZERO), 0);
/// ```
#[inline]
pub const fn ceil_secs(d: Duration) -> u64 {
    if d.subsec_nanos() == 0 {
        d.as_secs()
    } else {
        d.as_secs().saturating_add(1)
    }
}
