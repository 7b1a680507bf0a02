//! The script call: the policies as script parameters, groups of charges (one client key,
//! one hash tag, one atomic call), and one round trip of `limiter.lua` with its reply read
//! into decisions and receipts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::MAX_TOLERANCE_MICROS;
use super::guard::Guard;
use super::keys;
use super::link::Link;
use crate::clock::Clock;
use crate::store::{Receipt, StoreError};
use crate::{Algorithm, Decision, Key, Outcome, Policy};

/// Script algorithm codes (see `limiter.lua`).
pub(super) const ALGO_GCRA: u64 = 1;
pub(super) const ALGO_FIXED_WINDOW: u64 = 2;
pub(super) const ALGO_SLIDING_WINDOW: u64 = 3;
pub(super) const ALGO_SLIDING_LOG: u64 = 4;

/// How a policy reserves in a `reserve` call (sent in the stamp slot; see `limiter.lua`).
pub(super) const RESERVE_NONE: u64 = 0;
pub(super) const RESERVE_GCRA: u64 = 1;
pub(super) const RESERVE_SHAPER: u64 = 2;

/// Lua numbers are doubles: integers are exact up to 2^53.
const MAX_EXACT: u64 = 1 << 53;

/// A registered policy as the script sees it.
#[derive(Debug, Clone)]
pub(super) struct RedisPolicy {
    pub(super) name: Arc<str>,
    /// The limit decisions report: [`Policy::advertised`].
    pub(super) limit: u32,
    /// Largest cost that can ever fit (burst for GCRA, limit for the windows); also the most
    /// `remaining` can be.
    pub(super) capacity: u32,
    /// Script algorithm code and its three parameters (GCRA: T µs, tau µs, burst; windows:
    /// W µs, limit, 0).
    pub(super) algo: u64,
    pub(super) params: [u64; 3],
    /// How the policy reserves for the Delay mode ([`RESERVE_GCRA`], [`RESERVE_SHAPER`] or
    /// [`RESERVE_NONE`]: a check).
    pub(super) reserve: u64,
    /// The policy's [`Ban`](crate::Ban) as the script reads it: refusals, `within` µs,
    /// `duration` µs (`None`: no ban).
    pub(super) ban: Option<[u64; 3]>,
}

impl RedisPolicy {
    /// The script parameters of `policy`.
    ///
    /// # Errors
    ///
    /// [`StoreError::UnsupportedAlgorithm`] for the concurrency counter (see
    /// `RedisStore::concurrency` for shared concurrency slots);
    /// [`StoreError::UnsupportedQuota`] when the state would span more than
    /// [`MAX_TOLERANCE_MICROS`], a sliding window's `2 * limit * W` reaches 2^53 µs, or the
    /// quota's time step (GCRA and leaky bucket: the emission interval `T`; the windows and
    /// the log: the period `W`) is not a whole µs, the script's time unit: the memory store
    /// keeps it to the ns, and a rounded step would be a silently different rate.
    pub(super) fn new(policy: &Policy) -> Result<Self, StoreError> {
        let quota = policy.quota();
        let (step, what) = match policy.algorithm() {
            Algorithm::Gcra | Algorithm::LeakyBucket => (
                quota.emission_interval_nanos(),
                "its emission interval (period / limit)",
            ),
            _ => (quota.period_nanos(), "its period"),
        };
        if step % 1_000 != 0 {
            return Err(StoreError::UnsupportedQuota(format!(
                "policy {:?}: {what} is {step} ns, not a whole µs; the Redis store keeps time in \
                 µs and would run a different rate than {} per {:?}; choose a limit and period \
                 whose ratio is a whole µs",
                policy.name(),
                quota.limit(),
                quota.period(),
            )));
        }
        let reserve = match policy.algorithm() {
            Algorithm::Gcra => RESERVE_GCRA,
            Algorithm::LeakyBucket => RESERVE_SHAPER,
            _ => RESERVE_NONE,
        };
        let (algo, params, capacity, span_us) = match policy.algorithm() {
            // The leaky-bucket meter is GCRA with capacity = queue depth (= burst).
            Algorithm::Gcra | Algorithm::LeakyBucket => {
                let t_us = quota.emission_interval_nanos().div_ceil(1_000).max(1);
                let tau_us = t_us.saturating_mul(u64::from(quota.burst()));
                (
                    ALGO_GCRA,
                    [t_us, tau_us, u64::from(quota.burst())],
                    quota.burst(),
                    tau_us,
                )
            }
            Algorithm::FixedWindow => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                (
                    ALGO_FIXED_WINDOW,
                    [w_us, u64::from(quota.limit()), 0],
                    quota.limit(),
                    w_us,
                )
            }
            Algorithm::SlidingWindow => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                let limit = u64::from(quota.limit());
                // The estimate multiplies counts by W: keep 2 * limit * W exact in a double.
                if w_us.saturating_mul(limit).saturating_mul(2) > MAX_EXACT {
                    return Err(StoreError::UnsupportedQuota(format!(
                        "policy {:?}: 2 * limit * window is more than 2^53 µs, the Redis store's \
                         sliding window counter cannot compute it exactly",
                        policy.name()
                    )));
                }
                (ALGO_SLIDING_WINDOW, [w_us, limit, 0], quota.limit(), w_us)
            }
            Algorithm::SlidingLog => {
                let w_us = quota.period_nanos().div_ceil(1_000).max(1);
                (
                    ALGO_SLIDING_LOG,
                    [w_us, u64::from(quota.limit()), 0],
                    quota.limit(),
                    w_us,
                )
            }
            other => return Err(StoreError::UnsupportedAlgorithm(other)),
        };
        if span_us > MAX_TOLERANCE_MICROS {
            return Err(StoreError::UnsupportedQuota(format!(
                "policy {:?}: its state spans {span_us} µs, more than the Redis store's {MAX_TOLERANCE_MICROS} µs",
                policy.name()
            )));
        }
        Ok(Self {
            name: Arc::from(policy.name()),
            // The advertised quota (the burst for GCRA and the leaky bucket), so that
            // `remaining` never exceeds the reported limit.
            limit: policy.advertised().0,
            capacity,
            algo,
            params,
            reserve,
            // Whole µs (checked by `Policy::validate`), at most 365 days: exact in a double.
            ban: policy.ban().map(|b| {
                [
                    u64::from(b.refusals().get()),
                    b.within_nanos() / 1_000,
                    b.duration_nanos() / 1_000,
                ]
            }),
        })
    }
}

/// A group of charges sharing one client key (one hash tag, one script call).
#[derive(Debug, Clone, Default)]
pub(super) struct Group {
    /// The full key names, one after the other (each charge's `end` says where its name
    /// ends): one buffer for the group.
    names: String,
    charges: SmallVec<[GroupCharge; 1]>,
    /// The bans of the group's policies that have one: the charge's position in the group
    /// (from 1, as the script counts), the ban key, and the ban (see [`RedisPolicy::ban`]).
    /// Empty (no allocation) for policies without a ban.
    bans: Vec<(usize, String, [u64; 3])>,
}

/// One charge of a [`Group`].
#[derive(Debug, Clone, Copy)]
struct GroupCharge {
    /// Where its key name ends in [`Group::names`].
    end: usize,
    /// Algorithm code, three parameters, cost.
    params: [u64; 5],
    /// The receipt stamp a refund gives back (-1: none).
    stamp: i64,
    /// The capacity (the most `remaining` can be).
    capacity: u32,
    /// The limit reported.
    limit: u32,
    /// Index of the charge in the request.
    slot: usize,
}

/// The charges of one request split by client key: one group (one script call) per key.
pub(super) type Groups = SmallVec<[Group; 1]>;

/// The rows of one script call, one per charge of its group.
pub(super) type Rows = SmallVec<[Row; 1]>;

impl Group {
    /// Adds the charge `slot` of the request: `policy` for client `key`, whose name is
    /// `<prefix>:v2:{<tag>}:<policy>` (see `keys`).
    pub(super) fn push(
        &mut self,
        prefix: &str,
        key: &Key,
        policy: &RedisPolicy,
        cost: u64,
        receipt: Receipt,
        slot: usize,
    ) {
        if self.names.capacity() == 0 {
            // Room for the usual name, so one allocation holds it.
            self.names
                .reserve(prefix.len() + policy.name.len() + keys::VERSION.len() + 48);
        }
        keys::push_full(&mut self.names, prefix, key, &policy.name);
        let [p1, p2, p3] = policy.params;
        if let Some(ban) = policy.ban {
            let start = self.charges.last().map_or(0, |c| c.end);
            let full = self.names.get(start..).unwrap_or_default();
            self.bans.push((
                self.charges.len() + 1,
                super::keys::ban(full, &policy.name),
                ban,
            ));
        }
        self.charges.push(GroupCharge {
            end: self.names.len(),
            params: [policy.algo, p1, p2, p3, cost],
            stamp: stamp_of(receipt),
            capacity: policy.capacity,
            limit: policy.limit,
            slot,
        });
    }

    /// The same charges, to be given back with `receipts` (one per key, in order).
    pub(super) fn refund_of(&self, receipts: impl IntoIterator<Item = Receipt>) -> Self {
        let mut refund = self.clone();
        for (charge, receipt) in refund.charges.iter_mut().zip(receipts) {
            charge.stamp = stamp_of(receipt);
        }
        refund
    }

    /// Marks the keys whose charge index in the request passes `is_debit` as extra charges
    /// of a [`Mode::Correct`] call (their cost is charged without refusing; the others give
    /// back their cost by their receipt).
    pub(super) fn mark_debits(&mut self, is_debit: impl Fn(usize) -> bool) {
        for charge in &mut self.charges {
            if is_debit(charge.slot) {
                charge.stamp = DEBIT;
            }
        }
    }

    /// The number of charges.
    pub(super) fn len(&self) -> usize {
        self.charges.len()
    }

    /// The index in the request of each charge, in order.
    pub(super) fn slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.charges.iter().map(|c| c.slot)
    }

    /// The full key names, in order.
    fn names(&self) -> impl Iterator<Item = &str> + '_ {
        let mut start = 0;
        self.charges.iter().map(move |c| {
            let name = self.names.get(start..c.end).unwrap_or_default();
            start = c.end;
            name
        })
    }
}

/// A receipt as the script's stamp argument (-1: none).
fn stamp_of(receipt: Receipt) -> i64 {
    receipt
        .stamp()
        .map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX))
}

/// The stamp of a key in a [`Mode::Correct`] call that charges its cost without refusing.
const DEBIT: i64 = -2;

/// What a script call does (`ARGV[3]`).
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
    /// Forget every key and fence the receipts handed out before (see `limiter.lua`).
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

    /// Writes the mode argument (`ARGV[3]`).
    fn write(self, cmd: &mut redis::Cmd) {
        match self {
            Self::Check => cmd.arg("check"),
            Self::Peek => cmd.arg("peek"),
            Self::Refund => cmd.arg("refund"),
            Self::Correct => cmd.arg("correct"),
            Self::Reset => cmd.arg("reset"),
            Self::Inspect => cmd.arg("inspect"),
            Self::Reserve(max_wait_us) => cmd.arg(format!("reserve:{max_wait_us}")),
        };
    }
}

/// One key's answer: the decision, the receipt of an allowed charge, and how long the
/// decision's fields change only with elapsed time (`None`: as long as the key's state is
/// not written; see `limiter.lua`, `hold_of`), which bounds how long the negative cache may
/// repeat it.
pub(super) type Row = (Decision, Receipt, Option<Duration>);

/// Values per key in a script reply.
const ROW_LEN: usize = 7;

/// The answer of a `reserve` call: the rows, the delay and whether a denial is final.
#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) rows: Rows,
    pub(super) delay: Duration,
    pub(super) is_final: bool,
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

/// A protocol problem in a script answer (never turned into "allowed").
#[derive(Debug, thiserror::Error)]
#[error("unexpected answer from the rate-limit script: {0}")]
pub(super) struct BadReply(pub(super) &'static str);

/// Runs `limiter.lua`: the connection, the script, the TTL floor, the decision clock (when
/// injected) and the stale-call guard.
pub(super) struct ScriptRunner {
    pub(super) conn: Conn,
    script: redis::Script,
    /// Least PX of a write, ms (`ARGV[4]`).
    pub(super) min_ttl_ms: u64,
    /// Injected decision time (`ARGV[1]`); `None`: the script reads Redis `TIME`.
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

pub(super) fn unavailable(err: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::Unavailable(Box::new(err))
}

/// A `redis` error as a sentence: its `Display` writes error kinds with `Debug`
/// (`... - Server(ResponseError): DB index is out of range`, `ResponseError: ...`); this
/// keeps the description and the server's message. The error itself is the `source`.
#[derive(Debug)]
pub(super) struct RedisFailure(pub(super) redis::RedisError);

impl fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.0.to_string();
        // The server's own error: its code (`ERR`, `WRONGTYPE`...) and message.
        if let Some(code) = self.0.code() {
            if !text.contains(" - ") {
                return match self.0.detail() {
                    Some(detail) => write!(f, "Redis answered {code} {detail}"),
                    None => write!(f, "Redis answered {code}"),
                };
            }
        }
        // `<description> - <Kind>[: <detail>]`: the description and the detail.
        match text.split_once(" - ") {
            Some((description, kind)) => match kind.split_once(": ") {
                Some((_, detail)) => write!(f, "{description}: {detail}"),
                None => f.write_str(description),
            },
            None => f.write_str(&text),
        }
    }
}

impl std::error::Error for RedisFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

/// [`unavailable`] for a `redis` error, written as a sentence ([`RedisFailure`]).
pub(super) fn redis_failure(err: redis::RedisError) -> StoreError {
    unavailable(RedisFailure(err))
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
            script: redis::Script::new(include_str!("limiter.lua")),
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

    /// Whether decision time is injected (`ARGV[1]`) instead of read from Redis `TIME`.
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
    /// back a charge that did happen), and so does a reset (an operator asked for it). Every reply teaches the guard Redis's time.
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
            [delay, is_final] => (int(delay)?, int(is_final)? == 1),
            _ => return Err(unavailable(BadReply("no reservation"))),
        };
        Ok(Reservation {
            rows: parse_rows(group, rows)?,
            delay: Duration::from_micros(u64::try_from(delay).unwrap_or(0)),
            is_final,
        })
    }

    /// Sends `invocation` (prepared at app time `sent`, µs) on the store's connection and
    /// learns Redis's clock from the reply's first element, the server's `TIME` (the stale
    /// guard's offset); returns the rest of the reply.
    pub(super) async fn invoke(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
        sent: u64,
    ) -> Result<Vec<i64>, StoreError> {
        let mut reply: Vec<i64> = match &self.conn {
            Conn::Single(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
        .map_err(redis_failure)?;
        if reply.is_empty() {
            return Err(unavailable(BadReply("empty reply")));
        }
        let server = reply.remove(0);
        self.guard.learn(sent, u64::try_from(server).unwrap_or(0));
        Ok(reply)
    }

    /// The `EVALSHA` of `limiter.lua` for `group` in `mode`, sent at app time `sent` (µs),
    /// written straight into one command buffer (no argument list of its own).
    fn command(&self, group: &Group, mode: Mode, sent: u64) -> redis::Cmd {
        let n = group.len();
        let bans = group.bans.len();
        // Every key the script touches is declared: the states, their reset fences in the
        // modes that read or write them, the ban keys.
        let fences = mode.touches_fences();
        let keys = n * if fences { 2 } else { 1 } + bans;
        // EVALSHA, digest, key count, keys, 4 arguments, then 6 per key (5 params, stamp),
        // then the bans' tail (4 per ban and their count).
        let args = 3 + keys + 4 + 6 * n + if bans == 0 { 0 } else { 4 * bans + 1 };
        let names = group.names.len() * if fences { 2 } else { 1 };
        let bytes = 60 + names + 32 + 6 * 20 * n;
        let mut cmd = redis::Cmd::with_capacity(args, bytes);
        cmd.arg("EVALSHA").arg(self.script.get_hash()).arg(keys);
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
        // ARGV[1]: injected time (µs), "" for Redis TIME.
        match &self.now {
            Some(clock) => cmd.arg(clock.now() / 1_000),
            None => cmd.arg(""),
        };
        // ARGV[2]: the stale guard (Redis TIME µs), "" for none.
        let stale = match mode {
            Mode::Refund | Mode::Correct | Mode::Reset => None,
            Mode::Check | Mode::Peek | Mode::Inspect | Mode::Reserve(_) => self.guard.limit(sent),
        };
        match stale {
            Some(limit) => cmd.arg(limit),
            None => cmd.arg(""),
        };
        mode.write(&mut cmd);
        cmd.arg(self.min_ttl_ms);
        for charge in &group.charges {
            for v in charge.params {
                cmd.arg(v);
            }
            cmd.arg(charge.stamp);
        }
        if !group.bans.is_empty() {
            // The bans' tail (see `limiter.lua`): per ban the charge's position, refusals,
            // within µs and duration µs, then how many bans.
            for (at, _, [after, within, duration]) in &group.bans {
                cmd.arg(*at).arg(*after).arg(*within).arg(*duration);
            }
            cmd.arg(group.bans.len());
        }
        cmd
    }

    /// One round trip; the reply, checked for the status. On `NOSCRIPT` (Redis restarted or
    /// its scripts were flushed) the script is loaded and the call sent once more.
    async fn call_raw(&self, group: &Group, mode: Mode) -> Result<Reply, StoreError> {
        let sent = self.app_micros();
        let cmd = self.command(group, mode, sent);
        let link = self.conn.link();
        let value = match link.query(&cmd).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                self.script
                    .load_async(&mut link.clone())
                    .await
                    .map_err(redis_failure)?;
                link.query(&cmd).await
            }
            other => other,
        }
        .map_err(redis_failure)?;
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
            0 => Ok(Reply(values)),
            1 => Err(StoreError::Timeout),
            _ => Err(unavailable(BadReply("unknown status"))),
        }
    }
}

/// A script reply: Redis `TIME`, the status, then the values of the rows (and of a
/// reservation's tail).
struct Reply(Vec<redis::Value>);

impl Reply {
    /// The values after the server time and the status.
    fn rows(&self) -> &[redis::Value] {
        self.0.get(2..).unwrap_or_default()
    }
}

/// An integer of a script reply (Lua numbers come back as integers).
fn int(value: &redis::Value) -> Result<i64, StoreError> {
    match value {
        redis::Value::Int(v) => Ok(*v),
        _ => Err(unavailable(BadReply("not an integer"))),
    }
}

/// Seven integers per key: code, remaining, reset_after µs, retry_after µs, ns to take off
/// retry_after (0..999), receipt stamp, hold µs (-1: unbounded).
fn parse_rows(group: &Group, rows: &[redis::Value]) -> Result<Rows, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::{Algorithm, Quota};
    use redis::ErrorKind;
    use std::num::NonZeroU32;

    /// The arguments of `cmd` as text.
    fn args(cmd: &redis::Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_command_carries_the_script_arguments_in_order() {
        // GCRA 1 per second, burst 2 (T = 1 s, tau = 2 s); fixed window 5 per 10 s.
        let gcra = Quota::per_second(NonZeroU32::MIN).with_burst(2).unwrap();
        let gcra = RedisPolicy::new(&Policy::new("p1", gcra)).unwrap();
        let window = Quota::new(5, Duration::from_secs(10)).unwrap();
        let window = Policy::new("p2", window).with_algorithm(Algorithm::FixedWindow);
        let window = RedisPolicy::new(&window).unwrap();
        let key = Key::from("a b");
        let mut group = Group::default();
        group.push("rl", &key, &gcra, 1, Receipt::NONE, 0);
        group.push("rl", &key, &window, 3, Receipt::new(7), 1);
        assert_eq!(group.slots().collect::<Vec<_>>(), [0, 1]);

        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let timing = super::super::link::Timing {
            connect: Duration::from_millis(10),
            ready: Duration::from_millis(10),
            every: Duration::from_millis(10),
        };
        let clock = ManualClock::new();
        clock.set(42_000_000);
        let runner = ScriptRunner::new(
            Conn::Single(Link::single(client, timing)),
            5,
            Some(Arc::new(clock.clone())),
            Arc::new(clock),
            Guard::new(1_000),
        );
        let hash = runner.script.get_hash().to_owned();
        let mut expected = vec![
            "EVALSHA",
            &hash,
            "2",
            "rl:v2:{s:a%20b}:p1",
            "rl:v2:{s:a%20b}:p2",
            // Injected now (µs), no stale guard before a first reply, mode, min TTL.
            "42000",
            "",
            "check",
            "5",
            // Per key: algorithm, three parameters, cost, receipt stamp.
            "1",
            "1000000",
            "2000000",
            "2",
            "1",
            "-1",
            "2",
            "10000000",
            "5",
            "0",
            "3",
            "7",
        ];
        assert_eq!(args(&runner.command(&group, Mode::Check, 10)), expected);

        // With a learned offset the guard is sent + offset + allowance, Redis µs; a
        // reservation says how long it may wait; a peek or an inspection declares the
        // states alone, like a check.
        runner.guard.learn(10, 1_000_000);
        expected[6] = "1001000";
        assert_eq!(args(&runner.command(&group, Mode::Check, 10)), expected);
        for (mode, arg) in [(Mode::Peek, "peek"), (Mode::Inspect, "inspect")] {
            expected[7] = arg;
            assert_eq!(args(&runner.command(&group, mode, 10)), expected);
        }
        expected[7] = "reserve:250";
        assert_eq!(
            args(&runner.command(&group, Mode::Reserve(250), 10)),
            expected
        );
        // A refund, a correction and a reset carry no guard and declare each state's reset
        // fence after the states (the script reads or writes it): four keys.
        let fenced = |expected: &[&str], mode: &str| {
            let mut out: Vec<String> = expected.iter().map(|a| (*a).to_owned()).collect();
            out[2] = "4".to_owned();
            out[6] = String::new();
            out[7] = mode.to_owned();
            out.insert(5, "rl:v2:{s:a%20b}:p1#reset".to_owned());
            out.insert(6, "rl:v2:{s:a%20b}:p2#reset".to_owned());
            out
        };
        for (mode, arg) in [
            (Mode::Refund, "refund"),
            (Mode::Correct, "correct"),
            (Mode::Reset, "reset"),
        ] {
            assert_eq!(
                args(&runner.command(&group, mode, 10)),
                fenced(&expected, arg)
            );
        }
        // A refund group keeps the names and parameters, with the receipts given.
        let refund = group.refund_of([Receipt::new(11), Receipt::NONE]);
        expected[14] = "11";
        expected[20] = "-1";
        assert_eq!(
            args(&runner.command(&refund, Mode::Refund, 10)),
            fenced(&expected, "refund")
        );
    }

    /// A group with a ban declares the ban key last, after the states and (when the mode
    /// touches them) their fences.
    #[test]
    fn ban_keys_come_after_the_states_and_their_fences() {
        let quota = Quota::per_second(NonZeroU32::MIN);
        let ban = crate::Ban::after(NonZeroU32::MIN, Duration::from_secs(1))
            .lasting(Duration::from_secs(1));
        let banned = RedisPolicy::new(&Policy::new("p", quota).with_ban(ban)).unwrap();
        let mut group = Group::default();
        group.push("rl", &Key::from("k"), &banned, 1, Receipt::NONE, 0);
        let client = redis::Client::open("redis://127.0.0.1:1/").unwrap();
        let timing = super::super::link::Timing {
            connect: Duration::from_millis(10),
            ready: Duration::from_millis(10),
            every: Duration::from_millis(10),
        };
        let clock = ManualClock::new();
        let runner = ScriptRunner::new(
            Conn::Single(Link::single(client, timing)),
            0,
            None,
            Arc::new(clock),
            Guard::new(1_000),
        );
        let check = args(&runner.command(&group, Mode::Check, 0));
        assert_eq!(check[2..5], ["2", "rl:v2:{s:k}:p", "rl:v2:{s:k}:ban:p"]);
        let reset = args(&runner.command(&group, Mode::Reset, 0));
        assert_eq!(
            reset[2..6],
            [
                "3",
                "rl:v2:{s:k}:p",
                "rl:v2:{s:k}:p#reset",
                "rl:v2:{s:k}:ban:p"
            ]
        );
        // The bans' tail: the charge's position, refusals, within and duration (µs), count.
        assert_eq!(
            reset[reset.len() - 5..],
            ["1", "1", "1000000", "1000000", "1"]
        );
    }

    #[test]
    fn a_redis_error_reads_as_a_sentence() {
        let err = redis_failure(redis::RedisError::from((
            ErrorKind::InvalidClientConfig,
            "Redis server refused to switch database",
            "DB index is out of range".to_owned(),
        )));
        assert_eq!(
            err.to_string(),
            "the store is unavailable: Redis server refused to switch database: DB index is \
             out of range"
        );
        let err = redis_failure(redis::RedisError::from((
            ErrorKind::Io,
            "connection closed",
        )));
        assert_eq!(
            err.to_string(),
            "the store is unavailable: connection closed"
        );
        // The redis error stays the source.
        let source = std::error::Error::source(&err).and_then(std::error::Error::source);
        assert!(source.is_some_and(|s| s.is::<redis::RedisError>()));
    }
}
