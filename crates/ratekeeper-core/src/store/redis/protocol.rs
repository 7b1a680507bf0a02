//! The wire protocol between the Redis store and its Lua library, written once.
//!
//! Every number the two sides share (algorithm ids, ops, argument positions, the reply's
//! row layout, codes and sentinels) is a constant here, and the library's header is
//! rendered from them (`local ALGO_GCRA = 1` ...), so the Lua side names them and a change
//! on one side cannot miss the other. The library itself is one file per concern under
//! `lua/` ([`CHUNKS`]), assembled once per process:
//!
//! - as a Redis 7 function library ([`library`]: `FUNCTION LOAD`, then `FCALL` of
//!   [`limiter_function`] / [`lease_function`]), whose functions Redis defines once, when
//!   the library loads, instead of on every call;
//! - as two scripts for Redis 6 ([`limiter_script`], [`lease_script`]: `EVALSHA`, with
//!   `EVAL`'s `SCRIPT LOAD` on `NOSCRIPT`), the same library followed by one call of its
//!   entry.
//!
//! The library and function names carry the digest of the library's text, so instances of
//! different versions sharing one Redis each call their own.

use std::sync::LazyLock;

/// Defines each constant once, with its doc, and [`CONSTANTS`] listing them all for the
/// rendered header.
macro_rules! protocol {
    ($($(#[$doc:meta])* $name:ident: $ty:ty = $value:expr;)*) => {
        $($(#[$doc])* pub(super) const $name: $ty = $value;)*
        /// Every constant of the protocol, by name, as the header defines it.
        pub(super) const CONSTANTS: &[(&str, i64)] = &[$((stringify!($name), $name as i64)),*];
    };
}

protocol! {
    /// Algorithm id: GCRA (also the leaky-bucket meter). Parameters: T µs, tau µs, burst.
    ALGO_GCRA: u64 = 1;
    /// Algorithm id: fixed window. Parameters: W µs, limit, unused.
    ALGO_FIXED_WINDOW: u64 = 2;
    /// Algorithm id: sliding window counter. Parameters: W µs, limit, unused.
    ALGO_SLIDING_WINDOW: u64 = 3;
    /// Algorithm id: sliding window log. Parameters: W µs, limit, unused.
    ALGO_SLIDING_LOG: u64 = 4;

    /// Op: charge every key or none.
    OP_CHECK: u64 = 1;
    /// Op: report without writing.
    OP_PEEK: u64 = 2;
    /// Op: give back what each receipt still holds.
    OP_REFUND: u64 = 3;
    /// Op: settle corrections (give back by receipt, or charge a [`STAMP_DEBIT`] key).
    OP_CORRECT: u64 = 4;
    /// Op: forget every key and fence the receipts handed out before.
    OP_RESET: u64 = 5;
    /// Op: [`OP_PEEK`] with the bans in force reported.
    OP_INSPECT: u64 = 6;
    /// Op: reserve every key or none for a request that may wait ([`ARG_MAX_WAIT`]).
    OP_RESERVE: u64 = 7;

    /// Limiter argument: injected now (µs), or empty for Redis `TIME`.
    ARG_NOW: usize = 1;
    /// Limiter argument: the stale guard (Redis `TIME` µs), or empty for none.
    ARG_STALE: usize = 2;
    /// Limiter argument: the op.
    ARG_OP: usize = 3;
    /// Limiter argument: the least `PX` of a write (ms).
    ARG_MIN_TTL: usize = 4;
    /// The limiter's arguments before the charges (one more in [`OP_RESERVE`]).
    ARGS_HEAD: usize = 4;
    /// Limiter argument of [`OP_RESERVE`] only: the most the request may wait (µs).
    ARG_MAX_WAIT: usize = 5;
    /// Arguments per charge, after the head.
    CHARGE_ARGS: usize = 6;
    /// Charge argument offset: the algorithm id.
    CHARGE_ALGO: usize = 1;
    /// Charge argument offset: the first parameter.
    CHARGE_P1: usize = 2;
    /// Charge argument offset: the second parameter.
    CHARGE_P2: usize = 3;
    /// Charge argument offset: the third parameter.
    CHARGE_P3: usize = 4;
    /// Charge argument offset: the cost.
    CHARGE_COST: usize = 5;
    /// Charge argument offset: the stamp (a receipt, [`STAMP_NONE`], [`STAMP_DEBIT`], or in
    /// [`OP_RESERVE`] how the policy reserves).
    CHARGE_STAMP: usize = 6;
    /// Arguments per ban in the bans' tail (then one more: how many bans).
    BAN_ARGS: usize = 4;
    /// Ban argument offset: the position of its charge (from 1).
    BAN_CHARGE: usize = 1;
    /// Ban argument offset: the refusals that start the ban.
    BAN_REFUSALS: usize = 2;
    /// Ban argument offset: how long the refusals are counted (µs).
    BAN_WITHIN: usize = 3;
    /// Ban argument offset: how long a ban lasts (µs).
    BAN_DURATION: usize = 4;

    /// Stamp: no receipt (a refund gives nothing back; a reply row took nothing).
    STAMP_NONE: i64 = -1;
    /// Stamp in [`OP_CORRECT`]: charge the cost without refusing.
    STAMP_DEBIT: i64 = -2;
    /// Stamp in [`OP_RESERVE`]: the GCRA reservation.
    RESERVE_GCRA: i64 = 1;
    /// Stamp in [`OP_RESERVE`]: the leaky-bucket shaper.
    RESERVE_SHAPER: i64 = 2;
    /// Stamp in [`OP_RESERVE`]: the policy cannot reserve; a check.
    RESERVE_NONE: i64 = STAMP_NONE;

    /// Reply status: done.
    STATUS_DONE: i64 = 0;
    /// Reply status: stale (the guard passed; nothing written, no rows).
    STATUS_STALE: i64 = 1;
    /// Values before the rows: Redis `TIME` (µs), the status.
    REPLY_HEAD: usize = 2;
    /// Values per row.
    ROW_LEN: usize = 7;
    /// Row offset: the code.
    ROW_CODE: usize = 1;
    /// Row offset: remaining.
    ROW_REMAINING: usize = 2;
    /// Row offset: reset_after (µs).
    ROW_RESET: usize = 3;
    /// Row offset: retry_after (µs).
    ROW_RETRY: usize = 4;
    /// Row offset: ns to take off retry_after (0..999).
    ROW_LESS: usize = 5;
    /// Row offset: the receipt stamp ([`STAMP_NONE`]: took nothing).
    ROW_STAMP: usize = 6;
    /// Row offset: the hold (µs the row's fields change only with time).
    ROW_HOLD: usize = 7;
    /// Hold: as long as the key's state is not written.
    HOLD_UNBOUNDED: i64 = -1;
    /// Code: allowed.
    CODE_ALLOWED: i64 = 0;
    /// Code: denied now.
    CODE_DENIED: i64 = 1;
    /// Code: the cost can never fit.
    CODE_CANNOT_FIT: i64 = 2;
    /// Code: refused by a ban in force.
    CODE_BANNED: i64 = 3;
    /// Code: this refusal started a ban.
    CODE_BAN_STARTED: i64 = 4;
    /// A reservation's last value: its denial is final.
    FINAL: i64 = 1;
    /// A reservation's last value: not final (or allowed).
    NOT_FINAL: i64 = 0;

    /// The most spans a GCRA key's FIFO ledger keeps (past it, spans join: a refund may
    /// then give back less than its charge holds, never more).
    LEDGER_MAX_SPANS: usize = crate::algorithm::LEDGER_MAX_SPANS;

    /// Lease key: the state.
    LEASE_KEY_STATE: usize = 1;
    /// Lease key: the lease record.
    LEASE_KEY_RECORD: usize = 2;
    /// Lease argument: injected now (µs), or empty.
    LEASE_ARG_NOW: usize = 1;
    /// Lease argument: the stale guard, or empty.
    LEASE_ARG_STALE: usize = 2;
    /// Lease argument: the least `PX` of a write (ms).
    LEASE_ARG_MIN_TTL: usize = 3;
    /// Lease argument: the algorithm id ([`ALGO_GCRA`] or [`ALGO_FIXED_WINDOW`]).
    LEASE_ARG_ALGO: usize = 4;
    /// Lease argument: the first parameter.
    LEASE_ARG_P1: usize = 5;
    /// Lease argument: the second parameter.
    LEASE_ARG_P2: usize = 6;
    /// Lease argument: the third parameter.
    LEASE_ARG_P3: usize = 7;
    /// Lease argument: need, the least grant worth having.
    LEASE_ARG_NEED: usize = 8;
    /// Lease argument: want, the most to grant.
    LEASE_ARG_WANT: usize = 9;
    /// Lease argument: how soon unspent units are back at the latest (µs).
    LEASE_ARG_BACK_WITHIN: usize = 10;
    /// Lease reply values after Redis `TIME` and the status: granted, code, remaining,
    /// reset_after, retry_after, stamp, leased units, µs until they are back.
    LEASE_REPLY_LEN: usize = 8;
}

// A lease's algorithm and parameters are laid out as a limiter charge's (the lease reads them
// with the limiter's offsets).
const _: () = assert!(
    LEASE_ARG_P1 - LEASE_ARG_ALGO == CHARGE_P1 - CHARGE_ALGO
        && LEASE_ARG_P2 - LEASE_ARG_ALGO == CHARGE_P2 - CHARGE_ALGO
        && LEASE_ARG_P3 - LEASE_ARG_ALGO == CHARGE_P3 - CHARGE_ALGO
);

/// The text of a one-digit token (an op), as the script compares it: written without
/// formatting a number on every call.
pub(super) const fn digit(token: u64) -> &'static str {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    if token < 10 {
        DIGITS[token as usize]
    } else {
        ""
    }
}

// Every op is one digit (see `digit`); every row offset is within a row (`reply.rs` reads
// them from a `[i64; ROW_LEN]`).
const _: () = assert!(
    ROW_CODE >= 1
        && ROW_CODE <= ROW_LEN
        && ROW_REMAINING >= 1
        && ROW_REMAINING <= ROW_LEN
        && ROW_RESET >= 1
        && ROW_RESET <= ROW_LEN
        && ROW_RETRY >= 1
        && ROW_RETRY <= ROW_LEN
        && ROW_LESS >= 1
        && ROW_LESS <= ROW_LEN
        && ROW_STAMP >= 1
        && ROW_STAMP <= ROW_LEN
        && ROW_HOLD >= 1
        && ROW_HOLD <= ROW_LEN
);
const _: () = assert!(
    OP_CHECK < 10
        && OP_PEEK < 10
        && OP_REFUND < 10
        && OP_CORRECT < 10
        && OP_RESET < 10
        && OP_INSPECT < 10
        && OP_RESERVE < 10
);

/// Lua numbers are doubles: integers are exact up to 2^53.
pub(super) const MAX_EXACT: u64 = 1 << 53;

/// The library's chunks, one file per concern, in load order (each uses only what the
/// earlier ones define).
pub(super) const CHUNKS: [(&str, &str); 10] = [
    ("prelude.lua", include_str!("lua/prelude.lua")),
    ("gcra.lua", include_str!("lua/gcra.lua")),
    ("fixed_window.lua", include_str!("lua/fixed_window.lua")),
    ("sliding_window.lua", include_str!("lua/sliding_window.lua")),
    ("sliding_log.lua", include_str!("lua/sliding_log.lua")),
    ("charges.lua", include_str!("lua/charges.lua")),
    ("bans.lua", include_str!("lua/bans.lua")),
    ("shaper.lua", include_str!("lua/shaper.lua")),
    ("limiter.lua", include_str!("lua/limiter.lua")),
    ("lease.lua", include_str!("lua/lease.lua")),
];

/// The concurrency slots' script (sent with `EVALSHA`; see `lua/concurrency.lua`).
pub(super) const CONCURRENCY_SCRIPT: &str = include_str!("lua/concurrency.lua");
/// The fleet registry's script (see `lua/fleet.lua`).
pub(super) const FLEET_SCRIPT: &str = include_str!("lua/fleet.lua");

/// Whether the script compares constant `name` with an argument's text (algorithm ids and
/// ops: no number to parse, and equal strings are one pointer in Lua), so the header
/// defines it as a string.
pub(super) fn is_token(name: &str) -> bool {
    name.starts_with("ALGO_") || name.starts_with("OP_")
}

/// The header: one `local NAME = value` per constant (`'value'` for a token).
pub(super) fn header() -> String {
    let mut out = String::from("-- The wire protocol (rendered from protocol.rs).\n");
    for (name, value) in CONSTANTS {
        if is_token(name) {
            out.push_str(&format!("local {name} = '{value}'\n"));
        } else {
            out.push_str(&format!("local {name} = {value}\n"));
        }
    }
    out
}

/// The header and every chunk: the functions, no call.
fn body() -> &'static str {
    static BODY: LazyLock<String> = LazyLock::new(|| {
        let mut out = header();
        for (name, chunk) in CHUNKS {
            out.push_str(&format!("-- {name}\n"));
            out.push_str(chunk);
            out.push('\n');
        }
        out
    });
    &BODY
}

/// The digest that names the library and its functions (the first 16 hex digits of the
/// SHA1 of [`body`]).
fn version() -> &'static str {
    static VERSION: LazyLock<String> = LazyLock::new(|| {
        let hash = redis::Script::new(body()).get_hash().to_owned();
        hash.get(..16).unwrap_or(&hash).to_owned()
    });
    &VERSION
}

/// The Redis 7 function library (`FUNCTION LOAD` text).
pub(super) fn library() -> &'static str {
    static LIBRARY: LazyLock<String> = LazyLock::new(|| {
        format!(
            "#!lua name=ratekeeper_{v}\n{body}\
             redis.register_function('{limiter}', limiter)\n\
             redis.register_function('{lease}', lease)\n",
            v = version(),
            body = body(),
            limiter = limiter_function(),
            lease = lease_function(),
        )
    });
    &LIBRARY
}

/// The limiter's function name in [`library`].
pub(super) fn limiter_function() -> &'static str {
    static NAME: LazyLock<String> = LazyLock::new(|| format!("ratekeeper_limiter_{}", version()));
    &NAME
}

/// The lease's function name in [`library`].
pub(super) fn lease_function() -> &'static str {
    static NAME: LazyLock<String> = LazyLock::new(|| format!("ratekeeper_lease_{}", version()));
    &NAME
}

/// The texts of the limiter's and the lease's scripts: the library, then a call of the
/// entry with the script's `KEYS` and `ARGV`.
fn script_texts() -> &'static [String; 2] {
    static TEXTS: LazyLock<[String; 2]> = LazyLock::new(|| {
        [
            format!("{}return limiter(KEYS, ARGV)\n", body()),
            format!("{}return lease(KEYS, ARGV)\n", body()),
        ]
    });
    &TEXTS
}

/// The limiter's script text (the body of [`limiter_script`]).
pub(super) fn limiter_text() -> &'static str {
    &script_texts()[0]
}

/// The lease's script text (the body of [`lease_script`]).
pub(super) fn lease_text() -> &'static str {
    &script_texts()[1]
}

/// The limiter as a script (Redis 6: `EVALSHA`).
pub(super) fn limiter_script() -> &'static redis::Script {
    static SCRIPT: LazyLock<redis::Script> =
        LazyLock::new(|| redis::Script::new(&script_texts()[0]));
    &SCRIPT
}

/// The lease as a script (Redis 6: `EVALSHA`).
pub(super) fn lease_script() -> &'static redis::Script {
    static SCRIPT: LazyLock<redis::Script> =
        LazyLock::new(|| redis::Script::new(&script_texts()[1]));
    &SCRIPT
}

/// The text of every script `SCRIPT LOAD` loads when a connection is made ready: the
/// limiter's and the lease's (for Redis 6, and for `SCRIPT EXISTS`), the concurrency slots'
/// and the fleet registry's.
pub(super) fn scripts() -> [&'static str; 4] {
    let [limiter, lease] = script_texts();
    [limiter, lease, CONCURRENCY_SCRIPT, FLEET_SCRIPT]
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
