//! The reply of a limiter call read into decisions and receipts: a row of
//! [`ROW_LEN`] integers per charge (layout in [`protocol`](super::protocol)), and a
//! reservation's tail. A reply that does not parse is an error, never an "allowed".

use std::time::Duration;

use smallvec::SmallVec;

pub(super) use super::error::BadReply;
use super::error::unavailable;
use super::group::Group;
use super::protocol::{
    CODE_ALLOWED, CODE_BAN_STARTED, CODE_BANNED, CODE_CANNOT_FIT, CODE_DENIED, REPLY_HEAD,
    ROW_CODE, ROW_HOLD, ROW_LEN, ROW_LESS, ROW_REMAINING, ROW_RESET, ROW_RETRY, ROW_STAMP,
};
use crate::store::{Receipt, StoreError};
use crate::{Decision, Outcome};

/// The rows of one script call, one per charge of its group.
pub(super) type Rows = SmallVec<[Row; 1]>;
/// One key's answer: the decision, the receipt of an allowed charge, and how long the
/// decision's fields change only with elapsed time (`None`: as long as the key's state is
/// not written; see each algorithm's `row` in `lua/`), which bounds how long the negative cache may
/// repeat it.
pub(super) type Row = (Decision, Receipt, Option<Duration>);

/// The answer of a `reserve` call: the rows, the delay and whether a denial is final.
#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) rows: Rows,
    pub(super) delay: Duration,
    pub(super) is_final: bool,
}

/// A script reply: Redis `TIME`, the status, then the values of the rows (and of a
/// reservation's tail).
pub(super) struct Reply(pub(super) Vec<redis::Value>);

impl Reply {
    /// The values after the server time and the status.
    pub(super) fn rows(&self) -> &[redis::Value] {
        self.0.get(REPLY_HEAD..).unwrap_or_default()
    }
}

/// An integer of a script reply (Lua numbers come back as integers).
pub(super) fn int(value: &redis::Value) -> Result<i64, StoreError> {
    match value {
        redis::Value::Int(v) => Ok(*v),
        _ => Err(unavailable(BadReply("not an integer"))),
    }
}

/// [`ROW_LEN`] integers per key, in the order of the `ROW_*` offsets: code, remaining,
/// reset_after µs, retry_after µs, ns to take off retry_after (0..999), receipt stamp, hold
/// µs (`HOLD_UNBOUNDED`, negative: unbounded).
pub(super) fn parse_rows(group: &Group, rows: &[redis::Value]) -> Result<Rows, StoreError> {
    if rows.len() != group.len() * ROW_LEN {
        return Err(unavailable(BadReply("wrong number of values")));
    }
    let us = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    let mut out = Rows::new();
    for (chunk, charge) in rows.chunks_exact(ROW_LEN).zip(&group.charges) {
        let (capacity, limit) = (charge.capacity, charge.limit);
        // The value at a row offset (`ROW_*`, from 1 as Lua counts).
        let field = |offset: usize| match offset.checked_sub(1).and_then(|k| chunk.get(k)) {
            Some(value) => int(value),
            None => Err(unavailable(BadReply("short row"))),
        };
        let code = field(ROW_CODE)?;
        let remaining = field(ROW_REMAINING)?;
        let reset = field(ROW_RESET)?;
        let retry = field(ROW_RETRY)?;
        let less = field(ROW_LESS)?;
        let stamp = field(ROW_STAMP)?;
        let hold = field(ROW_HOLD)?;
        let less = Duration::from_nanos(u64::try_from(less.clamp(0, 999)).unwrap_or(0));
        let remaining = u32::try_from(remaining.clamp(0, i64::from(capacity))).unwrap_or(0);
        if let Some(decision) = ban_row(code, limit, us(retry).saturating_sub(less)) {
            out.push((decision, Receipt::NONE, (hold >= 0).then(|| us(hold))));
            continue;
        }
        let outcome = match code {
            CODE_ALLOWED => Outcome::Allowed,
            CODE_DENIED => Outcome::Denied {
                retry_after: us(retry).saturating_sub(less),
            },
            CODE_CANNOT_FIT => Outcome::CannotFit,
            _ => return Err(unavailable(BadReply("unknown outcome code"))),
        };
        let receipt = match (code, u64::try_from(stamp)) {
            (CODE_ALLOWED, Ok(stamp)) => Receipt::new(stamp),
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

/// The decision of a row whose code is a ban's: [`CODE_BANNED`] (refused by a ban in force)
/// or [`CODE_BAN_STARTED`] (this refusal started a ban); `None` for the other codes.
fn ban_row(code: i64, limit: u32, retry_after: Duration) -> Option<Decision> {
    match code {
        CODE_BANNED => Some(Decision::banned(limit, retry_after)),
        CODE_BAN_STARTED => Some(Decision::banned(limit, retry_after).with_ban_started()),
        _ => None,
    }
}
