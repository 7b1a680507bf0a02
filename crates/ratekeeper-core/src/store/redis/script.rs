//! The script call: one round trip of `limiter.lua` for a [`Group`] of charges (one client
//! key, one hash tag, one atomic call), its arguments written into one command, its reply
//! read by [`reply`](super::reply).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::group::Group;
use super::guard::Guard;
use super::keys;
use super::link::Link;
use super::policy::MAX_EXACT;
use super::reply::{BadReply, ROW_LEN, Reply, Reservation, Rows, int, parse_rows};
use crate::clock::Clock;
use crate::store::StoreError;

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

#[cfg(test)]
mod tests {
    use super::super::policy::RedisPolicy;
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::Receipt;
    use crate::{Algorithm, Key, Policy, Quota};
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
