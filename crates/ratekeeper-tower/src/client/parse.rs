//! Reading what a server announced: `Retry-After`, the IETF `RateLimit` field and the
//! `X-RateLimit-*` / `RateLimit-*` trios. Every parser here is total: any byte string is
//! either understood or ignored, never a panic, and numbers are capped.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::RETRY_AFTER;
use http::{HeaderMap, HeaderName, StatusCode};

/// The longest wait any announcement can ask for: one year (31 536 000 s). A value that
/// would mean a longer wait is implausible and ignored, like a malformed one.
pub(crate) const MAX_ANNOUNCED_SECS: u64 = 365 * 24 * 60 * 60;

/// Longest field value read, in bytes; a longer value is ignored as malformed.
const MAX_VALUE_LEN: usize = 4096;

/// Numbers at or above this (2001-09-09 as Unix seconds; 31 years as a delay) are read as
/// Unix seconds, below it as delay seconds.
const UNIX_SECONDS_FROM: u64 = 1_000_000_000;

/// Numbers at or above this (the year 33 658 as Unix seconds, 2001-09-09 as Unix
/// milliseconds) are read as Unix milliseconds.
const UNIX_MILLIS_FROM: u64 = 1_000_000_000_000;

/// Numbers at or above this (the year 33 658 as Unix milliseconds) are ignored.
const IMPLAUSIBLE_FROM: u64 = 1_000_000_000_000_000;

use crate::headers::{
    RATELIMIT, RATELIMIT_REMAINING as LEGACY_REMAINING, RATELIMIT_RESET as LEGACY_RESET,
    X_RATELIMIT_REMAINING as X_REMAINING, X_RATELIMIT_RESET as X_RESET,
};

/// How long a response asks its client to wait before the next request, if it says
/// anything about it; `now` is the wall-clock time used for HTTP-dates and Unix times.
///
/// `Some(Duration::ZERO)` when the fields it carries say the client may go on (a remaining
/// count above 0, a reset or date already past, `Retry-After: 0`): a recorded wait is then
/// shortened. `None` when it carries no field this reader understands (absent, malformed or
/// implausible, see [`plausible_wait`]).
pub(crate) fn announced_wait_at(
    status: StatusCode,
    headers: &HeaderMap,
    now: SystemTime,
) -> Option<Duration> {
    let retry =
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            single(headers, &RETRY_AFTER).and_then(|v| retry_after(v, now))
        } else {
            None
        };
    let ietf = ietf_ratelimit(headers, now);
    let x = trio(headers, &X_REMAINING, &X_RESET, now);
    let legacy = trio(headers, &LEGACY_REMAINING, &LEGACY_RESET, now);
    [retry, ietf, x, legacy].into_iter().flatten().max()
}

/// The wait a number announces, read by plausibility, the same way in every field
/// (`Retry-After`, `X-RateLimit-Reset`, `RateLimit-Reset`, the IETF `t`): servers write
/// delay seconds, Unix seconds or Unix milliseconds, whatever the field's definition says.
///
/// - below 10⁹: delay seconds;
/// - 10⁹ to 10¹² − 1: Unix seconds (from 2001-09-09); the time until then;
/// - 10¹² to 10¹⁵ − 1: Unix milliseconds (from 2001-09-09); the time until then;
/// - above, or a wait longer than [`MAX_ANNOUNCED_SECS`] (one year): implausible, `None`.
///
/// A Unix time in the past is no wait (`Duration::ZERO`).
pub(crate) fn plausible_wait(raw: u64, now: SystemTime) -> Option<Duration> {
    let wait = if raw < UNIX_SECONDS_FROM {
        Duration::from_secs(raw)
    } else if raw < UNIX_MILLIS_FROM {
        until(UNIX_EPOCH.checked_add(Duration::from_secs(raw))?, now)
    } else if raw < IMPLAUSIBLE_FROM {
        until(UNIX_EPOCH.checked_add(Duration::from_millis(raw))?, now)
    } else {
        return None;
    };
    (wait <= Duration::from_secs(MAX_ANNOUNCED_SECS)).then_some(wait)
}

/// The one value of field `name` as bytes, or `None` when it is absent, repeated (which of
/// two numbers would be meant?) or longer than [`MAX_VALUE_LEN`].
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h [u8]> {
    let mut all = headers.get_all(name).iter();
    let value = all.next()?;
    if all.next().is_some() || value.len() > MAX_VALUE_LEN {
        return None;
    }
    Some(value.as_bytes())
}

/// `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date (IMF-fixdate, or the
/// obsolete RFC 850 and asctime forms). A number is read by [`plausible_wait`] (a server
/// that writes a Unix time there is understood); a date in the past means no wait, a date
/// more than a year ahead is ignored.
pub(crate) fn retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let value = trim_ows(value);
    if let Some(n) = digits(value) {
        return plausible_wait(n, now);
    }
    let text = std::str::from_utf8(value).ok()?;
    let date = httpdate::parse_http_date(text).ok()?;
    let wait = until(date, now);
    (wait <= Duration::from_secs(MAX_ANNOUNCED_SECS)).then_some(wait)
}

/// A non-negative decimal integer: ASCII digits only (at least one), saturating at
/// `u64::MAX` (which [`plausible_wait`] ignores).
pub(crate) fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(value.iter().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// A remaining count with its reset: `Remaining: 0` announces the time until the reset
/// ([`plausible_wait`]), a remaining count above 0 announces no wait. A missing, malformed
/// or implausible value announces nothing.
fn trio(
    headers: &HeaderMap,
    remaining: &HeaderName,
    reset: &HeaderName,
    now: SystemTime,
) -> Option<Duration> {
    let left = digits(trim_ows(single(headers, remaining)?))?;
    if left != 0 {
        return Some(Duration::ZERO);
    }
    plausible_wait(digits(trim_ows(single(headers, reset)?))?, now)
}

/// Time from `now` until `at`, zero when `at` has passed.
fn until(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

fn trim_ows(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

/// The IETF `RateLimit` field (draft-ietf-httpapi-ratelimit-headers-11): a structured-field
/// list of policy items, `"name";r=<remaining>;t=<seconds until reset>`. Returns the longest
/// `t` ([`plausible_wait`]) among the items with `r=0`, or no wait when every item with an
/// `r` has some left. Several field lines form one list. A malformed field is ignored as a
/// whole, as the draft asks of clients, and so is an implausible `t`.
pub(crate) fn ietf_ratelimit(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut longest: Option<Duration> = None;
    let mut some_left = false;
    let mut total = 0usize;
    for line in headers.get_all(&RATELIMIT) {
        total = total.saturating_add(line.len());
        if total > MAX_VALUE_LEN {
            return None;
        }
        for item in parse_list(line.as_bytes())? {
            match (item.r, item.t) {
                (Some(0), Some(t)) => {
                    let t = plausible_wait(t, now)?;
                    longest = Some(longest.map_or(t, |l| l.max(t)));
                }
                (Some(r), _) if r > 0 => some_left = true,
                _ => {}
            }
        }
    }
    longest.or(some_left.then_some(Duration::ZERO))
}

/// The `r` and `t` parameters of one list member.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Item {
    pub(crate) r: Option<u64>,
    pub(crate) t: Option<u64>,
}

/// A value of a structured-field parameter or bare item, as far as this reader cares.
enum Bare {
    Integer(u64),
    Other,
}

/// Parses an RFC 9651 List of Items, keeping `r` and `t`; `None` when malformed (including
/// `r` or `t` that is not a non-negative integer).
pub(crate) fn parse_list(input: &[u8]) -> Option<Vec<Item>> {
    let mut p = Cursor { s: input, i: 0 };
    let mut items = Vec::new();
    p.skip_ows();
    if p.at_end() {
        return Some(items);
    }
    loop {
        p.bare_item()?;
        let mut item = Item::default();
        while p.peek() == Some(b';') {
            p.i += 1;
            p.skip_sp();
            let key = p.key()?;
            let value = if p.peek() == Some(b'=') {
                p.i += 1;
                p.bare_item()?
            } else {
                Bare::Other // a boolean true
            };
            let slot = match key {
                b"r" => &mut item.r,
                b"t" => &mut item.t,
                _ => continue,
            };
            match value {
                Bare::Integer(n) => *slot = Some(n),
                Bare::Other => return None,
            }
        }
        items.push(item);
        p.skip_ows();
        if p.at_end() {
            return Some(items);
        }
        if p.peek() != Some(b',') {
            return None;
        }
        p.i += 1;
        p.skip_ows();
        if p.at_end() {
            return None; // a trailing comma
        }
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn at_end(&self) -> bool {
        self.i >= self.s.len()
    }

    fn skip_sp(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    fn skip_ows(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.i += 1;
        }
    }

    /// Consumes bytes while `f` holds; returns them.
    fn take_while(&mut self, f: impl Fn(u8) -> bool) -> &'a [u8] {
        let start = self.i;
        while self.peek().is_some_and(&f) {
            self.i += 1;
        }
        self.s.get(start..self.i).unwrap_or_default()
    }

    /// A parameter key: `lcalpha / "*"` then `lcalpha / DIGIT / "_" / "-" / "." / "*"`.
    fn key(&mut self) -> Option<&'a [u8]> {
        if !matches!(self.peek(), Some(b'a'..=b'z' | b'*')) {
            return None;
        }
        Some(self.take_while(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'_' | b'-' | b'.' | b'*')
        }))
    }

    fn bare_item(&mut self) -> Option<Bare> {
        match self.peek()? {
            b'"' => {
                self.i += 1;
                loop {
                    match self.peek()? {
                        b'"' => {
                            self.i += 1;
                            return Some(Bare::Other);
                        }
                        b'\\' => {
                            self.i += 1;
                            if !matches!(self.peek()?, b'"' | b'\\') {
                                return None;
                            }
                            self.i += 1;
                        }
                        0x20..=0x7e => self.i += 1,
                        _ => return None,
                    }
                }
            }
            b'-' | b'0'..=b'9' => {
                let negative = self.peek() == Some(b'-');
                if negative {
                    self.i += 1;
                }
                let int = self.take_while(|c| c.is_ascii_digit());
                if int.is_empty() || int.len() > 15 {
                    return None;
                }
                if self.peek() == Some(b'.') {
                    self.i += 1;
                    let frac = self.take_while(|c| c.is_ascii_digit());
                    if frac.is_empty() || frac.len() > 3 || int.len() > 12 {
                        return None;
                    }
                    return Some(Bare::Other);
                }
                if negative {
                    return Some(Bare::Other);
                }
                // At most 15 digits: no overflow.
                Some(Bare::Integer(
                    int.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')),
                ))
            }
            b'?' => {
                self.i += 1;
                matches!(self.peek()?, b'0' | b'1').then(|| {
                    self.i += 1;
                    Bare::Other
                })
            }
            b':' => {
                self.i += 1;
                self.take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'/' | b'='));
                (self.peek()? == b':').then(|| {
                    self.i += 1;
                    Bare::Other
                })
            }
            c if c.is_ascii_alphabetic() || c == b'*' => {
                self.take_while(|c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&c));
                Some(Bare::Other)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
