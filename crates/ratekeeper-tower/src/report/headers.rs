//! The header styles, and writing and merging the rate-limit header fields.

use std::cell::LazyCell;
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue};
use ratekeeper_core::ceil_secs;
use ratekeeper_core::store::Decisions;
use ratekeeper_core::{Decision, Policy};

use super::Reporter;
use crate::client::parse::plausible_wait;
use crate::headers::{RATELIMIT, RATELIMIT_POLICY};

/// Which rate-limit headers to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset` (the default).
    #[default]
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` per draft-ietf-httpapi-ratelimit-headers-11: one
    /// named item per policy.
    Ietf,
    /// `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (delta seconds) as in
    /// drafts -00 to -03, reporting the policy closest to exhaustion.
    IetfLegacy,
    /// [`HeaderStyle::XRateLimit`] and [`HeaderStyle::Ietf`] together.
    Both,
    /// No rate-limit headers (a 429 still carries `Retry-After`).
    None,
}

/// How reset values are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ResetFormat {
    /// Seconds until the quota is fully available again, rounded up (the default).
    #[default]
    DeltaSeconds,
    /// Unix time in seconds at which the quota is fully available again, rounded up. Only
    /// `X-RateLimit-Reset` uses it; the IETF fields are always delta seconds.
    UnixEpoch,
}

/// Sets `name` to `value`. With `merge`, when the field already holds lists of policy items
/// (each line starting with a quoted name, as draft-ietf-httpapi-ratelimit-headers-11 §3 and
/// §4 define them; an inner ratekeeper layer writes these), the field becomes those lists,
/// every line of them, followed by `value` (RFC 9651 §3.1: a List may be split across field
/// lines, and joining with ", " is the same List), on a single field line. Lines that are not
/// policy lists are dropped.
fn insert_or_append(headers: &mut HeaderMap, name: &HeaderName, value: HeaderValue, merge: bool) {
    let joined = merge
        .then(|| {
            let mut v = Vec::new();
            for old in headers.get_all(name) {
                if old.as_bytes().starts_with(b"\"") {
                    v.extend_from_slice(old.as_bytes());
                    v.extend_from_slice(b", ");
                }
            }
            if v.is_empty() {
                return None;
            }
            v.extend_from_slice(value.as_bytes());
            HeaderValue::from_bytes(&v).ok()
        })
        .flatten();
    headers.insert(name.clone(), joined.unwrap_or(value));
}

/// A reset value at or above this is a Unix time, below it a delta (1e9 s is 2001-09-09,
/// and 31 years: no window is that long). Lets a layer compare an inner layer's reset
/// whatever [`ResetFormat`] that one writes; a Unix time is read by size (seconds, or
/// milliseconds from 10¹²), as the polite client reads it.
const EPOCH_RESET_FROM: u64 = 1_000_000_000;

/// This layer's reset for one policy: the value written, and the same as delta seconds.
#[derive(Clone, Copy)]
struct Reset {
    value: u64,
    delta: u64,
}

/// The three fields of a single-policy style.
#[derive(Clone, Copy)]
enum Fields {
    /// `X-RateLimit-Limit`, `-Remaining`, `-Reset`.
    XRateLimit,
    /// `RateLimit-Limit`, `-Remaining`, `-Reset` (drafts -00 to -03).
    Legacy,
}

impl Fields {
    /// Limit, remaining and reset names, fresh from constants (no clone per response).
    fn names(self) -> [HeaderName; 3] {
        match self {
            Self::XRateLimit => [
                crate::headers::X_RATELIMIT_LIMIT,
                crate::headers::X_RATELIMIT_REMAINING,
                crate::headers::X_RATELIMIT_RESET,
            ],
            Self::Legacy => [
                crate::headers::RATELIMIT_LIMIT,
                crate::headers::RATELIMIT_REMAINING,
                crate::headers::RATELIMIT_RESET,
            ],
        }
    }
}

/// Writes one policy's limit, remaining and reset (`None`: no window, the field is removed)
/// under `fields`, replacing what was there.
///
/// With `merge` (a response from the inner service: an inner ratekeeper layer, or a handler
/// passing on an upstream's headers, may have reported already), an earlier report that is
/// complete (limit and remaining numbers, reset a number or absent) and more restrictive
/// (fewer remaining, or as many and a later reset, compared as delta seconds; `now_secs`
/// gives the Unix time for an earlier reset written as one) is put back, so the client sees
/// the tighter of the two limits, as one consistent set.
///
/// The inserts return what they replaced, so the usual response (no earlier report) costs
/// three inserts and three checks; the comparison is out of line.
#[inline]
fn single_policy(
    headers: &mut HeaderMap,
    fields: Fields,
    shown: Shown,
    reset: Option<Reset>,
    merge: bool,
    now_secs: impl FnOnce() -> u64,
) {
    let [limit_name, remaining_name, reset_name] = fields.names();
    let old_limit = headers.insert(limit_name, number(shown.limit.into()));
    let old_remaining = headers.insert(remaining_name, number(shown.remaining.into()));
    let old_reset = match reset {
        Some(reset) => headers.insert(reset_name, number(reset.value)),
        None => headers.remove(reset_name),
    };
    if !merge {
        return;
    }
    if let (Some(old_limit), Some(old_remaining)) = (old_limit, old_remaining) {
        let earlier = Earlier {
            limit: old_limit,
            remaining: old_remaining,
            reset: old_reset,
        };
        keep_tighter(headers, fields, shown, reset, earlier, now_secs);
    }
}

/// The fields an inner layer (or the handler) had written before this layer's report.
struct Earlier {
    limit: HeaderValue,
    remaining: HeaderValue,
    reset: Option<HeaderValue>,
}

/// The merge of [`single_policy`]: puts `earlier` back when it is a complete report and
/// more restrictive than this layer's.
#[cold]
#[inline(never)]
fn keep_tighter(
    headers: &mut HeaderMap,
    fields: Fields,
    shown: Shown,
    reset: Option<Reset>,
    earlier: Earlier,
    now_secs: impl FnOnce() -> u64,
) {
    let (Some(prior_limit), Some(prior)) = (
        parse_number(&earlier.limit),
        parse_number(&earlier.remaining),
    ) else {
        return;
    };
    if prior > prior_limit {
        // Not a consistent report (more remaining than its limit): this layer's replaces it.
        return;
    }
    let prior_reset = match earlier.reset.as_ref().map(parse_number) {
        None => 0,
        Some(None) => return,
        Some(Some(at)) if at >= EPOCH_RESET_FROM => {
            let now = UNIX_EPOCH + Duration::from_secs(now_secs());
            match plausible_wait(at, now) {
                Some(wait) => ceil_secs(wait),
                // Implausible (beyond Unix milliseconds, or over a year away): not a report
                // this layer would pass on.
                None => return,
            }
        }
        Some(Some(delta)) => delta,
    };
    let mine = u64::from(shown.remaining);
    if prior < mine || (prior == mine && prior_reset > reset.map_or(0, |r| r.delta)) {
        let [limit_name, remaining_name, reset_name] = fields.names();
        headers.insert(limit_name, earlier.limit);
        headers.insert(remaining_name, earlier.remaining);
        match earlier.reset {
            Some(value) => headers.insert(reset_name, value),
            None => headers.remove(reset_name),
        };
    }
}

/// A header value holding a decimal number exactly as the single-policy styles write it:
/// ASCII digits only, no sign, no whitespace, no leading zero (`0` itself is fine), at most
/// `u64::MAX`. Anything else (`+5`, ` 0 `, `007`, `1e3`) is not a report this layer would
/// pass on, so the merge treats it as absent and writes its own values.
fn parse_number(value: &HeaderValue) -> Option<u64> {
    let canonical = match value.as_bytes() {
        [] => false,
        [b'0'] => true,
        [b'0', ..] => false,
        digits => digits.iter().all(u8::is_ascii_digit),
    };
    if !canonical {
        return None;
    }
    value.to_str().ok()?.parse().ok()
}

pub(super) fn join_items<'a>(items: impl Iterator<Item = &'a str>, pk: Option<&str>) -> String {
    let mut out = String::new();
    for item in items {
        if !out.is_empty() {
            out.push_str(", ");
        }
        out.push_str(item);
        if let Some(pk) = pk {
            out.push_str(";pk=");
            out.push_str(pk);
        }
    }
    out
}

/// The advertised quota of `policy` as `(q, w)`: the most a client can ever see remaining
/// (`X-RateLimit-Limit`, the IETF `q`) and the window it refers to in whole seconds (the
/// IETF `w`, at least 1).
///
/// For GCRA and the leaky bucket `q` is the capacity (the burst) and `w` the time an empty
/// bucket takes to refill completely at the quota's rate, burst × period / limit, rounded up
/// to whole seconds (7 per second advertises `w=1`: the emission interval's rounding up to
/// a whole ns is not counted); so `q / w` is the sustained rate and `0 <= remaining <= q` always holds, also
/// when the burst is larger than the per-period limit. Window algorithms (fixed window,
/// sliding log, sliding window) and the concurrency limit keep `limit` and the period.
///
/// ```text
/// GCRA 1 per 1 s, burst 10       q=10  w=10
/// GCRA 100 per 60 s, burst 10    q=10  w=6     (emission interval 600 ms)
/// GCRA 10 per 60 s, burst 10     q=10  w=60
/// fixed window 100 per 60 s      q=100 w=60
/// ```
pub(crate) fn advertised_quota(policy: &Policy) -> (u32, u64) {
    let (q, window) = policy.advertised();
    // `w` must be a positive integer: sub-second windows round up to 1 s.
    (q, ceil_secs(window).max(1))
}

/// What the single-policy styles show for one decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Shown {
    /// The advertised quota ([`advertised_quota`]).
    pub(super) limit: u32,
    /// Whole requests left, never above `limit`.
    pub(super) remaining: u32,
}

impl Reporter {
    /// The limit and remaining shown for `d`, the decision of the layer's policy `policy`:
    /// the policy's advertised quota, and the remaining clamped to it, so that
    /// `0 <= remaining <= limit` holds on every response (also for state written under
    /// other parameters). Without a policy index, the only policy's (see
    /// [`Reporter::needs_policy_indices`]), else the decision's own limit.
    #[inline]
    pub(super) fn shown(&self, policy: Option<usize>, d: &Decision) -> Shown {
        let policy = policy.or_else(|| (self.limits.len() == 1).then_some(0));
        let limit = policy
            .and_then(|i| self.limits.get(i).copied())
            .unwrap_or_else(|| d.limit());
        Shown {
            limit,
            remaining: d.remaining().min(limit),
        }
    }

    /// Whether [`Reporter::headers`] needs the layer's policy index of each decision: for
    /// the IETF fields (they name every policy), and with several policies (the deciding
    /// one's advertised quota). With one policy and a single-policy style an empty slice
    /// will do, which spares collecting the indices per request.
    #[inline]
    pub(crate) fn needs_policy_indices(&self) -> bool {
        matches!(self.style, HeaderStyle::Ietf | HeaderStyle::Both) || self.limits.len() > 1
    }

    /// The decision the single-policy styles report (the one closest to exhaustion, the
    /// denying one on a 429) and what they show for it.
    #[inline]
    pub(super) fn deciding<'d>(
        &self,
        decisions: &'d Decisions,
        policies: &[usize],
    ) -> Option<(&'d Decision, Shown)> {
        let i = decisions.deciding()?;
        let d = decisions.as_slice().get(i)?;
        Some((d, self.shown(policies.get(i).copied(), d)))
    }

    pub(super) fn reset_value(&self, d: &Decision, unix_now: impl FnOnce() -> Duration) -> u64 {
        match self.reset {
            ResetFormat::DeltaSeconds => ceil_secs(d.reset_after()),
            ResetFormat::UnixEpoch => ceil_secs(unix_now().saturating_add(d.reset_after())),
        }
    }

    /// Adds the rate-limit headers for `decisions`, so that each appears once.
    ///
    /// The response may already report a limit: nested layers (a global `Router::layer`
    /// around a per-route `route_layer`), or a handler passing on an upstream's headers. The
    /// single-policy styles then keep the more restrictive of the two (fewer remaining, then
    /// the later reset), read back from the values the inserts replace, so the common case
    /// (nothing there yet) costs nothing extra; the IETF lists get this layer's items
    /// appended (RFC 9651 §3.1).
    pub(crate) fn headers(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
        headers: &mut HeaderMap,
    ) {
        self.write_headers(decisions, policies, pk, unix_now, headers, true);
    }

    /// [`Reporter::headers`], merging with an earlier report only when `merge`.
    pub(super) fn write_headers(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        unix_now: impl FnOnce() -> Duration,
        headers: &mut HeaderMap,
        merge: bool,
    ) {
        let Some((d, shown)) = self.deciding(decisions, policies) else {
            return;
        };
        let (x, ietf, legacy) = match self.style {
            HeaderStyle::XRateLimit => (true, false, false),
            HeaderStyle::Ietf => (false, true, false),
            HeaderStyle::IetfLegacy => (false, false, true),
            HeaderStyle::Both => (true, true, false),
            HeaderStyle::None => (false, false, false),
        };
        // Read at most once, and only for a Unix-time reset (or a merge with one).
        let unix_now = LazyCell::new(unix_now);
        let delta = ceil_secs(d.reset_after());
        if x {
            let reset = (!self.windowless).then(|| Reset {
                value: self.reset_value(d, || *unix_now),
                delta,
            });
            single_policy(headers, Fields::XRateLimit, shown, reset, merge, || {
                unix_now.as_secs()
            });
        } else if legacy {
            let reset = (!self.windowless).then_some(Reset {
                value: delta,
                delta,
            });
            single_policy(headers, Fields::Legacy, shown, reset, merge, || {
                unix_now.as_secs()
            });
        }
        if ietf {
            self.ietf_headers(decisions, policies, pk, headers, merge);
        }
    }

    fn ietf_headers(
        &self,
        decisions: &Decisions,
        policies: &[usize],
        pk: Option<&str>,
        headers: &mut HeaderMap,
        merge: bool,
    ) {
        // The policies this request was charged to (a resolver may pick a subset).
        let every_policy = policies.len() == self.policy_items.len()
            && policies.iter().enumerate().all(|(i, p)| i == *p);
        let policy = match pk {
            None if every_policy => self.policy_value.clone(),
            _ => HeaderValue::try_from(join_items(
                policies
                    .iter()
                    .filter_map(|&i| self.policy_items.get(i))
                    .map(|s| &**s),
                pk,
            ))
            .ok(),
        };
        if let Some(policy) = policy {
            insert_or_append(headers, &RATELIMIT_POLICY, policy, merge);
        }
        let mut state = String::new();
        for (&i, d) in policies.iter().zip(decisions.as_slice()) {
            let name = self.names.get(i).map_or("", |n| &**n);
            if !state.is_empty() {
                state.push_str(", ");
            }
            // Writing to a String cannot fail.
            let _ = write!(state, "\"{name}\";r={}", self.shown(Some(i), d).remaining);
            if !self.windowless {
                let _ = write!(state, ";t={}", ceil_secs(d.reset_after()));
            }
            if let Some(pk) = pk {
                state.push_str(";pk=");
                state.push_str(pk);
            }
        }
        if let Ok(value) = HeaderValue::try_from(state) {
            insert_or_append(headers, &RATELIMIT, value, merge);
        }
    }
}

/// Header values for `0..SMALL_NUMBERS` are made at compile time and cloned for free.
const SMALL_NUMBERS: usize = 1024;

/// The decimal digits of `0..SMALL_NUMBERS`, one after the other: 10 one-digit, 90
/// two-digit, 900 three-digit and 24 four-digit numbers.
const DIGITS_LEN: usize = 10 + 90 * 2 + 900 * 3 + (SMALL_NUMBERS - 1000) * 4;

/// Every number below [`SMALL_NUMBERS`] as ASCII digits, concatenated.
static DIGITS: [u8; DIGITS_LEN] = {
    let mut out = [0u8; DIGITS_LEN];
    let mut at = 0;
    let mut n = 0;
    while n < SMALL_NUMBERS {
        let width = decimal_width(n);
        let mut rest = n;
        let mut i = width;
        while i > 0 {
            i -= 1;
            out[at + i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        at += width;
        n += 1;
    }
    out
};

/// The number of decimal digits of `n` (below 10 000).
const fn decimal_width(n: usize) -> usize {
    match n {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        _ => 4,
    }
}

/// A header value for each number below [`SMALL_NUMBERS`], pointing into [`DIGITS`]: a
/// clone copies four words, with no allocation and no shared counter, and no lazy set-up is
/// checked per use.
static SMALL: [HeaderValue; SMALL_NUMBERS] = {
    const ZERO: HeaderValue = HeaderValue::from_static("0");
    let mut out = [ZERO; SMALL_NUMBERS];
    let mut at = 0;
    let mut n = 0;
    while n < SMALL_NUMBERS {
        let width = decimal_width(n);
        let (_, tail) = DIGITS.split_at(at);
        let (digits, _) = tail.split_at(width);
        let text = match std::str::from_utf8(digits) {
            Ok(text) => text,
            // ASCII digits are UTF-8; a failure here stops the build, not a request.
            Err(_) => panic!("digits are UTF-8"),
        };
        std::mem::forget(std::mem::replace(
            &mut out[n],
            HeaderValue::from_static(text),
        ));
        at += width;
        n += 1;
    }
    out
};

/// A header value holding `n` in decimal: a clone of a value made at compile time below
/// 1024, otherwise a fresh one.
#[inline]
pub(super) fn number(n: u64) -> HeaderValue {
    match usize::try_from(n).ok().and_then(|i| SMALL.get(i)) {
        Some(value) => value.clone(),
        None => HeaderValue::from(n),
    }
}
