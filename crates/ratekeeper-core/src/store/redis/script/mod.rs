//! The script call: one round trip of the limiter (the Lua library's `limiter` entry, see
//! [`protocol`](super::protocol)) for a [`Group`] of charges (one client key, one hash tag,
//! one atomic call), its arguments written into one command, its reply read by
//! [`reply`](super::reply).
//!
//! A call is an `FCALL` of the library's function where Redis has functions (Redis 7: the
//! library loaded when the connection was made ready), else an `EVALSHA` of the same code
//! as a script (Redis 6). `FCALL` of a function Redis no longer has (`FUNCTION FLUSH`, a
//! server replaced by one without functions) loads the library again and sends the call
//! once more, or falls back to `EVALSHA`; `EVALSHA` of a script Redis no longer has
//! (`NOSCRIPT`: a restart, `SCRIPT FLUSH`) loads it (`SCRIPT LOAD`) and sends the call once
//! more. When that second call misses too (a Cluster whose slot map is stale after a
//! failover: the load went to the old primary, the call to the new one), the call is sent a
//! third time as an `EVAL` carrying the script's text, which needs nothing loaded. No manual
//! step is ever needed.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::error::{BadReply, redis_failure};
use super::group::Group;
use super::guard::Guard;
use super::keys;
use super::link::Link;
use super::protocol::{
    self, ARGS_HEAD, BAN_ARGS, CHARGE_ARGS, FINAL, MAX_EXACT, OP_CHECK, OP_CORRECT, OP_INSPECT,
    OP_PEEK, OP_REFUND, OP_RESERVE, OP_RESET, ROW_LEN, STATUS_DONE, STATUS_STALE,
};
use super::reply::{Reply, Reservation, Rows, int, parse_rows};
use crate::clock::Clock;
use crate::store::StoreError;

pub(super) use super::error::unavailable;

/// What a limiter call does (its op, `ARG_OP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Charge every key or none.
    Check,
    /// Report without writing.
    Peek,
    /// Give back what each receipt still holds.
    Refund,
    /// Settle corrections: per key, give back by the receipt, or charge without refusing
    /// (a key marked by [`Group::mark_debits`]).
    Correct,
    /// Forget every key and fence the receipts handed out before (see `lua/limiter.lua`).
    Reset,
    /// [`Mode::Peek`] with the bans in force reported (an operator's peek).
    Inspect,
    /// Reserve every key or none for a request that may wait up to this many µs (the
    /// Delay mode); each key's stamp says how its policy reserves.
    Reserve(u64),
}

impl Mode {
    /// Whether the script reads or writes the reset fences of the keys in this mode (a
    /// refund or a correction reads them, a reset writes them), so the call declares them
    /// in `KEYS` after the states.
    pub(super) const fn touches_fences(self) -> bool {
        matches!(self, Self::Refund | Self::Correct | Self::Reset)
    }

    /// The op code.
    const fn op(self) -> u64 {
        match self {
            Self::Check => OP_CHECK,
            Self::Peek => OP_PEEK,
            Self::Refund => OP_REFUND,
            Self::Correct => OP_CORRECT,
            Self::Reset => OP_RESET,
            Self::Inspect => OP_INSPECT,
            Self::Reserve(_) => OP_RESERVE,
        }
    }
}

/// An entry of the Lua library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Entry {
    /// Decisions, peeks, refunds, corrections, resets, reservations.
    Limiter,
    /// The tiered store's leases.
    Lease,
}

impl Entry {
    #[inline]
    fn function(self) -> &'static str {
        match self {
            Self::Limiter => protocol::limiter_function(),
            Self::Lease => protocol::lease_function(),
        }
    }

    /// The script's text (what `EVAL` sends).
    fn text(self) -> &'static str {
        match self {
            Self::Limiter => protocol::limiter_text(),
            Self::Lease => protocol::lease_text(),
        }
    }

    fn script(self) -> &'static redis::Script {
        match self {
            Self::Limiter => protocol::limiter_script(),
            Self::Lease => protocol::lease_script(),
        }
    }

    /// A command calling this entry with `keys` keys (`FCALL` when `functions`, else
    /// `EVALSHA`), room made for `args` more arguments and `bytes` bytes.
    #[inline]
    pub(super) fn command(
        self,
        functions: bool,
        keys: usize,
        args: usize,
        bytes: usize,
    ) -> redis::Cmd {
        let mut cmd = redis::Cmd::with_capacity(3 + keys + args, 60 + bytes);
        if functions {
            cmd.arg("FCALL").arg(self.function());
        } else {
            cmd.arg("EVALSHA").arg(self.script().get_hash());
        }
        cmd.arg(keys);
        cmd
    }
}

/// Whether `err` is Redis's `NOSCRIPT` (no script with that hash is loaded).
fn is_no_script(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Sends `evalsha` (an `EVALSHA` of `script`, whose text is `text`) on `link`; a script Redis
/// does not have (`NOSCRIPT`) is loaded and the call sent again (see [`load_and_send`]).
pub(super) async fn send_script(
    link: &Link,
    script: &redis::Script,
    text: &str,
    evalsha: &redis::Cmd,
) -> redis::RedisResult<redis::Value> {
    match link.query(evalsha).await {
        Err(err) if is_no_script(&err) => load_and_send(link, script, text, evalsha).await,
        other => other,
    }
}

/// Loads `script` (`SCRIPT LOAD`) and sends `evalsha` (its `EVALSHA`); when Redis still does
/// not have it (a Cluster slot map that sent the load to the old primary after a failover),
/// sends the call as an `EVAL` of `text`, which needs nothing loaded.
async fn load_and_send(
    link: &Link,
    script: &redis::Script,
    text: &str,
    evalsha: &redis::Cmd,
) -> redis::RedisResult<redis::Value> {
    script.load_async(&mut link.clone()).await?;
    match link.query(evalsha).await {
        Err(err) if is_no_script(&err) => link.query(&eval(text, evalsha)).await,
        other => other,
    }
}

/// `evalsha` (an `EVALSHA` of the script whose text is `text`) as an `EVAL` of that text:
/// the same keys and arguments, nothing that must be loaded first.
fn eval(text: &str, evalsha: &redis::Cmd) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(text);
    for arg in evalsha.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            cmd.arg(bytes);
        }
    }
    cmd
}

/// Whether `err` says Redis has no such function (`FUNCTION FLUSH`), or no functions at all
/// (`FCALL` unknown: a Redis before 7).
fn is_missing_function(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && err
            .detail()
            .is_some_and(|d| d.contains("Function not found") || d.starts_with("unknown command"))
}

/// The store's connection to a standalone Redis or a Redis Cluster (a [`Link`] either way:
/// replaced by the breaker's prober when it reconnects).
#[derive(Clone, Debug)]
pub(super) enum Conn {
    Single(Link),
    Cluster(Link),
}

impl Conn {
    /// The link, whatever the kind.
    pub(super) fn link(&self) -> &Link {
        match self {
            Self::Single(l) | Self::Cluster(l) => l,
        }
    }
}

/// Runs the library's entries: the connection, the TTL floor, the decision clock (when
/// injected) and the stale-call guard.
pub(super) struct ScriptRunner {
    pub(super) conn: Conn,
    /// Least PX of a write, ms (`ARG_MIN_TTL`).
    pub(super) min_ttl_ms: u64,
    /// Injected decision time (`ARG_NOW`); `None`: the script reads Redis `TIME`.
    pub(super) now: Option<Arc<dyn Clock>>,
    /// The app's monotonic clock, for the guard's "sent" times.
    app: Arc<dyn Clock>,
    pub(super) guard: Guard,
}

impl fmt::Debug for ScriptRunner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptRunner")
            .field("min_ttl_ms", &self.min_ttl_ms)
            .field("injected_now", &self.now.is_some())
            .field("guard", &self.guard)
            .finish_non_exhaustive()
    }
}

impl ScriptRunner {
    pub(super) fn new(
        conn: Conn,
        min_ttl_ms: u64,
        now: Option<Arc<dyn Clock>>,
        app: Arc<dyn Clock>,
        guard: Guard,
    ) -> Self {
        Self {
            conn,
            min_ttl_ms,
            now,
            app,
            guard,
        }
    }

    /// The connection (a cheap clone of the manager or cluster handle).
    pub(super) fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Whether decision time is injected (`ARG_NOW`) instead of read from Redis `TIME`.
    pub(super) fn injected(&self) -> bool {
        self.now.is_some()
    }

    /// The app's monotonic clock in µs.
    pub(super) fn app_micros(&self) -> u64 {
        self.app.now() / 1_000
    }

    /// One round trip: the decision and receipt of every key of `group`, in its order.
    ///
    /// A check or peek carries the stale guard (a call reaching Redis after its caller gave up
    /// does nothing and fails with [`StoreError::Timeout`]); a refund always applies (it gives
    /// back a charge that did happen), and so does a reset (an operator asked for it). Every
    /// reply teaches the guard Redis's time.
    pub(super) async fn call(&self, group: &Group, mode: Mode) -> Result<Rows, StoreError> {
        let reply = self.call_raw(group, mode).await?;
        parse_rows(group, reply.rows())
    }

    /// A `reserve` round trip (see [`ScriptRunner::call`]): the rows, then the delay (µs)
    /// and finality.
    pub(super) async fn reserve(
        &self,
        group: &Group,
        max_wait: Duration,
    ) -> Result<Reservation, StoreError> {
        let max_wait_us = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        // Lua numbers are exact up to 2^53: a longer wait is "unbounded" anyway.
        let reply = self
            .call_raw(group, Mode::Reserve(max_wait_us.min(MAX_EXACT)))
            .await?;
        let values = reply.rows();
        if values.len() != group.len() * ROW_LEN + 2 {
            return Err(unavailable(BadReply("wrong number of values")));
        }
        let (rows, tail) = values.split_at(group.len() * ROW_LEN);
        let (delay, is_final) = match tail {
            [delay, is_final] => (int(delay)?, int(is_final)? == FINAL),
            _ => return Err(unavailable(BadReply("no reservation"))),
        };
        Ok(Reservation {
            rows: parse_rows(group, rows)?,
            delay: Duration::from_micros(u64::try_from(delay).unwrap_or(0)),
            is_final,
        })
    }

    /// The injected now (µs) as the first argument, or an empty one for Redis `TIME`.
    #[inline]
    pub(super) fn write_now(&self, cmd: &mut redis::Cmd) {
        match &self.now {
            Some(clock) => cmd.arg(clock.now() / 1_000),
            None => cmd.arg(""),
        };
    }

    /// The stale guard for a call sent at app time `sent` (µs), or an empty argument.
    #[inline]
    pub(super) fn write_guard(&self, cmd: &mut redis::Cmd, sent: u64) {
        match self.guard.limit(sent) {
            Some(limit) => cmd.arg(limit),
            None => cmd.arg(""),
        };
    }

    /// The limiter's command for `group` in `mode`, sent at app time `sent` (µs), written
    /// straight into one command buffer (no argument list of its own): `FCALL` when
    /// `functions`, else `EVALSHA`.
    pub(super) fn command(
        &self,
        group: &Group,
        mode: Mode,
        sent: u64,
        functions: bool,
    ) -> redis::Cmd {
        let n = group.len();
        let bans = group.bans.len();
        // Every key the script touches is declared: the states, their reset fences in the
        // modes that read or write them, the ban keys.
        let fences = mode.touches_fences();
        let keys = n * if fences { 2 } else { 1 } + bans;
        let reserve = matches!(mode, Mode::Reserve(_));
        let args = keys
            + ARGS_HEAD
            + usize::from(reserve)
            + CHARGE_ARGS * n
            + if bans == 0 { 0 } else { BAN_ARGS * bans + 1 };
        let names = group.names.len() * if fences { 2 } else { 1 };
        let mut cmd = Entry::Limiter.command(functions, keys, args, names + 32 + 6 * 20 * n);
        for name in group.names() {
            cmd.arg(name);
        }
        if fences {
            let mut fence = String::new();
            for name in group.names() {
                fence.clear();
                keys::push_fence(&mut fence, name);
                cmd.arg(fence.as_str());
            }
        }
        for (_, key, _) in &group.bans {
            cmd.arg(key);
        }
        // The head (ARG_NOW, ARG_STALE, ARG_OP, ARG_MIN_TTL, and ARG_MAX_WAIT in a
        // reservation); a refund, a correction and a reset carry no stale guard.
        self.write_now(&mut cmd);
        match mode {
            Mode::Refund | Mode::Correct | Mode::Reset => cmd.arg(""),
            Mode::Check | Mode::Peek | Mode::Inspect | Mode::Reserve(_) => {
                self.write_guard(&mut cmd, sent);
                &mut cmd
            }
        };
        cmd.arg(protocol::digit(mode.op())).arg(self.min_ttl_ms);
        if let Mode::Reserve(max_wait_us) = mode {
            cmd.arg(max_wait_us);
        }
        // Per charge: algorithm, three parameters, cost, stamp (CHARGE_*).
        for charge in &group.charges {
            for v in charge.params {
                cmd.arg(v);
            }
            cmd.arg(charge.stamp);
        }
        if !group.bans.is_empty() {
            // The bans' tail (BAN_*): per ban the charge's position, refusals, within µs and
            // duration µs, then how many bans.
            for (at, _, [after, within, duration]) in &group.bans {
                cmd.arg(*at).arg(*after).arg(*within).arg(*duration);
            }
            cmd.arg(group.bans.len());
        }
        cmd
    }

    /// Sends the command `build` writes for `entry` (given whether it is an `FCALL`) on the
    /// store's connection; its reply. A function Redis does not have (any more) loads the
    /// library again and sends the call once more, or, on a Redis without functions, falls
    /// back to `EVALSHA`; a script Redis does not have (`NOSCRIPT`) is loaded and the call
    /// sent once more. A call that still finds nothing loaded is sent as an `EVAL`.
    pub(super) async fn send(
        &self,
        entry: Entry,
        build: impl Fn(bool) -> redis::Cmd,
    ) -> Result<redis::Value, StoreError> {
        let link = self.conn.link();
        let functions = link.functions();
        let cmd = build(functions);
        let result = match link.query(&cmd).await {
            Err(err) if functions && is_missing_function(&err) => {
                if link.load_library().await.map_err(redis_failure)? {
                    match link.query(&cmd).await {
                        Err(err) if is_missing_function(&err) => {
                            link.query(&eval(entry.text(), &build(false))).await
                        }
                        other => other,
                    }
                } else {
                    self.evalsha(entry, &build(false)).await
                }
            }
            Err(err) if !functions && is_no_script(&err) => self.evalsha(entry, &cmd).await,
            other => other,
        };
        result.map_err(redis_failure)
    }

    /// Loads `entry`'s script and sends `cmd` (its `EVALSHA`); as an `EVAL` when Redis
    /// still does not have it.
    async fn evalsha(&self, entry: Entry, cmd: &redis::Cmd) -> redis::RedisResult<redis::Value> {
        load_and_send(self.conn.link(), entry.script(), entry.text(), cmd).await
    }

    /// Reads a reply's head (Redis `TIME` µs, the status), teaches the guard Redis's time
    /// (the call was sent at app time `sent`), and turns a stale status into
    /// [`StoreError::Timeout`]; the whole reply.
    #[inline]
    pub(super) fn read_head(
        &self,
        value: redis::Value,
        sent: u64,
    ) -> Result<Vec<redis::Value>, StoreError> {
        let redis::Value::Array(values) = value else {
            return Err(unavailable(BadReply("not an array")));
        };
        let (server, status) = match values.as_slice() {
            [server, status, ..] => (int(server)?, int(status)?),
            [] => return Err(unavailable(BadReply("empty reply"))),
            [_] => return Err(unavailable(BadReply("no status"))),
        };
        self.guard.learn(sent, u64::try_from(server).unwrap_or(0));
        match status {
            STATUS_DONE => Ok(values),
            STATUS_STALE => Err(StoreError::Timeout),
            _ => Err(unavailable(BadReply("unknown status"))),
        }
    }

    /// One round trip of the limiter; the reply, checked for the status.
    async fn call_raw(&self, group: &Group, mode: Mode) -> Result<Reply, StoreError> {
        let sent = self.app_micros();
        let value = self
            .send(Entry::Limiter, |functions| {
                self.command(group, mode, sent, functions)
            })
            .await?;
        Ok(Reply(self.read_head(value, sent)?))
    }
}

#[cfg(test)]
mod tests;
