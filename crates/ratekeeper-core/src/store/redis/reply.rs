//! The reply of a `limiter.lua` call read into decisions and receipts: seven integers per
//! charge, and a reservation's tail. A reply that does not parse is an error, never an
//! "allowed".

use std::time::Duration;

use smallvec::SmallVec;

use super::group::Group;
use super::script::unavailable;
use crate::store::{Receipt, StoreError};
use crate::{Decision, Outcome};

/// The rows of one script call, one per charge of its group.
pub(super) type Rows = SmallVec<[Row; 1]>;
/// One key's answer: the decision, the receipt of an allowed charge, and how long the
/// decision's fields change only with elapsed time (`None`: as long as the key's state is
/// not written; see `limiter.lua`, `hold_of`), which bounds how long the negative cache may
/// repeat it.
pub(super) type Row = (Decision, Receipt, Option<Duration>);

/// Values per key in a script reply.
pub(super) const ROW_LEN: usize = 7;

/// The answer of a `reserve` call: the rows, the delay and whether a denial is final.
#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) rows: Rows,
    pub(super) delay: Duration,
    pub(super) is_final: bool,
}

/// A protocol problem in a script answer (never turned into "allowed").
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer from the rate-limit script: {0}")]
pub(super) struct BadReply(pub(super) &'static str);

/// A script reply: Redis `TIME`, the status, then the values of the rows (and of a
/// reservation's tail).
pub(super) struct Reply(pub(super) Vec<redis::Value>);

impl Reply {
    /// The values after the server time and the status.
    pub(super) fn rows(&self) -> &[redis::Value] {
        self.0.get(2..).unwrap_or_default()
    }
}

/// An integer of a script reply (Lua numbers come back as integers).
pub(super) fn int(value: &redis::Value) -> Result<i64, StoreError> {
    match value {
        redis::Value::Int(v) => Ok(*v),
        _ => Err(unavailable(BadReply("not an integer"))),
    }
}

/// Seven integers per key: code, remaining, reset_after µs, retry_after µs, ns to take off
/// retry_after (0..999), receipt stamp, hold µs (-1: unbounded).
pub(super) fn parse_rows(group: &Group, rows: &[redis::Value]) -> Result<Rows, StoreError> {
    if rows.len() != group.len() * ROW_LEN {
        return Err(unavailable(BadReply("wrong number of values")));
    }
    let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    let mut out = Rows::new();
    for (chunk, charge) in rows.chunks_exact(ROW_LEN).zip(&group.charges) {
        let (capacity, limit) = (charge.capacity, charge.limit);
        let [code, remaining, reset, retry, less, stamp, hold] = chunk else {
            return Err(unavailable(BadReply("short row")));
        };
        let [code, remaining, reset, retry, less, stamp, hold] = [
            int(code)?,
            int(remaining)?,
            int(reset)?,
            int(retry)?,
            int(less)?,
            int(stamp)?,
            int(hold)?,
        ];
        let less = Duration::from_nanos(u64::try_from(less.clamp(0, 999)).unwrap_or(0));
        let remaining = u32::try_from(remaining.clamp(0, i64::from(capacity))).unwrap_or(0);
        if let Some(decision) = ban_row(code, limit, us(retry).saturating_sub(less)) {
            out.push((decision, Receipt::NONE, (hold >= 0).then(|| us(hold))));
            continue;
        }
        let outcome = match code {
            0 => Outcome::Allowed,
            1 => Outcome::Denied {
                retry_after: us(retry).saturating_sub(less),
            },
            2 => Outcome::CannotFit,
            _ => return Err(unavailable(BadReply("unknown outcome code"))),
        };
        let receipt = match (code, u64::try_from(stamp)) {
            (0, Ok(stamp)) => Receipt::new(stamp),
            _ => Receipt::NONE,
        };
        let hold = (hold >= 0).then(|| us(hold));
        out.push((
            Decision::new(outcome, limit, remaining, us(reset)),
            receipt,
            hold,
        ));
    }
    Ok(out)
}

/// The decision of a row whose code is a ban's (see `limiter.lua`): 3 = refused by a ban in
/// force, 4 = this refusal started a ban; `None` for the other codes.
fn ban_row(code: i64, limit: u32, retry_after: Duration) -> Option<Decision> {
    match code {
        3 => Some(Decision::banned(limit, retry_after)),
        4 => Some(Decision::banned(limit, retry_after).with_ban_started()),
        _ => None,
    }
}
