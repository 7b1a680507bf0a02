//! The Redis store (feature `redis`): one budget shared by every app instance.
//!
//! [`RedisStore`] implements [`Store<Key>`] over Redis standalone or Redis Cluster through the
//! [`redis`] crate (tokio, connection manager, cluster-async, scripts), so the same policies,
//! algorithms and headers work unchanged when limits are shared.
//!
//! # How a decision is made
//!
//! - **One Lua library, one round trip per decision.** The store's Lua library holds the
//!   twin of each
//!   supported algorithm: GCRA ([`Gcra`](crate::algorithm::Gcra), also the leaky-bucket
//!   meter, which is GCRA with capacity = queue depth), the fixed window
//!   ([`FixedWindow`](crate::algorithm::FixedWindow)) and the sliding window counter
//!   ([`SlidingWindow`](crate::algorithm::SlidingWindow); `2 * limit * W` must stay below
//!   2^53 µs so the doubles of Lua stay exact), with the same formulas in integer **µs**, so
//!   they decide exactly like the memory store (a differential sweep of random sequences
//!   checks it). A policy whose time step is not a whole µs (GCRA and leaky bucket:
//!   `T = period / limit`; the windows and the log: `W`) is refused at registration with
//!   [`StoreError::UnsupportedQuota`] naming the policy and its limit, never run at a
//!   rounded, silently different rate: "3 per second" (`T` = 333 333 333.3 ns) is refused,
//!   "4 per second" or "3 per 3 s" are taken. The sliding window counter's `retry_after`, a
//!   fraction of `W`, is computed to the ns like the memory store's.
//!   Policies with different algorithms on one client key still run in one atomic call. The
//!   sliding log ([`SlidingLog`](crate::algorithm::SlidingLog)) has its twin too (see
//!   "Sliding log" below). The concurrency counter is refused as a policy at build time
//!   ([`StoreError::UnsupportedAlgorithm`]): shared concurrency limits use
//!   [`RedisStore::slots`] instead (see "Concurrency slots" below). On Redis 7 the library
//!   is loaded as a function library (`FUNCTION LOAD`, on every primary of a Cluster) and
//!   each decision is an `FCALL`: Redis defines the library's functions once, when it
//!   loads, not on every call. On Redis 6 (no functions) the same code is sent as a script
//!   with `EVALSHA`. The arguments are written straight into one command buffer. A
//!   function Redis lost (`FUNCTION FLUSH`) is loaded again, a script it lost (`NOSCRIPT`
//!   after a restart or a `SCRIPT FLUSH`) too (`SCRIPT LOAD`), and the call sent once more,
//!   so no manual step is ever needed. The library and function names carry the digest of
//!   the library's text (`ratekeeper_<digest>`, `ratekeeper_limiter_<digest>`), so
//!   instances of different versions on one Redis each call their own; a library no
//!   instance uses any more stays loaded until `FUNCTION DELETE` or `FUNCTION FLUSH`.
//! - **One time source.** Every time that enters a decision comes from Redis `TIME` inside the
//!   script, so app instances never disagree about "now"; [`RedisStoreBuilder::clock`]
//!   injects time instead (tests). The app's wall clock takes no part in a decision or in a
//!   guard around it, so **any** skew between an app's clock and Redis's is tolerated (see
//!   the stale guard below).
//! - **Keys** are `rl:v2:{<client key>}:<policy>`. The hash tag holds the whole client key, so
//!   every policy of one client lives in one Cluster slot and a multi-policy check is one
//!   atomic script. Every key a script reads or writes (the states, their reset fences in
//!   a refund, correction or reset, the ban keys) is declared in the call's `KEYS`, as
//!   Redis's scripting contract asks. The tag encodes the key's kind
//!   (`ip:`, `net:`, `i:`, `s:`, tuples in parentheses) so different keys never share a name;
//!   `{ } | % ( ) ,`, spaces, control and non-ASCII bytes are escaped as `%XX`, and encodings
//!   longer than 128 bytes become `h:<sha1>`. `v2` is the state-format version: a deploy
//!   that changes the layout uses new keys and never reads the old ones.
//! - **State layout (v2)** records the parameter each state was written under: GCRA
//!   `"<TAT>:<T>:<tau>"` (tau recorded since the Delay-mode reservations, see below), fixed window `"<window>:<count>:<W>"`, sliding window counter
//!   `"<window>:<current>:<previous>:<W>"` (all in µs).
//! - **Parameters in force.** State written under an old quota (another deploy, same policy
//!   name) is read under the quota now in force, so a raised quota applies at once and a
//!   lowered one is enforced at once. GCRA: a TAT written under another emission interval
//!   keeps the units it holds, `used = ceil((TAT - now) / T_old)`, re-spaced by the new `T`:
//!   `TAT = now + min(used * T, tau)`; and a TAT never lies more than `tau` ahead of now.
//!   Windows: counts are the units charged and are read as stored, so a lowered limit
//!   applies at once to the units already counted (a count above it refuses until enough
//!   of it has aged out: the fixed window until it ends, the sliding window counter within
//!   the next window); a state written under another window length moves the units it
//!   still counts into the current window of the new length (never mixing the two
//!   windowings).
//! - **Receipts.** An allowed charge returns a [`Receipt`](crate::store::Receipt): GCRA and the
//!   leaky bucket the TAT right after the charge (µs), the windows the index of the window it
//!   counted in. A refund gives back only what that charge still holds: GCRA the whole charge
//!   when it is still the latest (stored TAT = receipt), nothing when the bucket has drained it
//!   or a later reservation still waits (TAT - tau > now), otherwise at most the part of its slot
//!   that lies ahead of now, `min(cost * T, min(receipt, TAT) - now)`, never below now; the fixed
//!   window only in the window it counted in; the sliding window counter from the current count
//!   in that window, from the previous count in the next, and nothing later.
//! - **Peek and reset.** [`RedisStore::peek_async`] reads a key's state without writing
//!   (the script's `peek` mode); [`RedisStore::reset_async`] forgets a key under one policy
//!   or all of them in one atomic call and writes a **fence** beside each state
//!   (`<state key>#reset`, same hash tag), so that a receipt handed out before the reset
//!   gives back nothing after it, from any instance (see [`RedisStore::reset_async`] for
//!   the bound and how long the fence lives).
//! - **Corrections** ([`Store::correct`], [`RedisStore::correct_async`]): one script call
//!   (`correct` mode) per client key. A give-back follows the refund rules on the state
//!   with its debt (a GCRA TAT beyond `now + tau` is paid off, not kept for a waiting
//!   reservation; a window count above the limit is kept whole); an extra charge of `x`
//!   units is forced at the time of the correction, never refused: GCRA
//!   `TAT = max(TAT, now) + x * T`, windows `count += x` in the current window, the sliding
//!   log `x` units stamped now. The state may go beyond the capacity and later requests
//!   wait the debt out, as in the memory store: a window count above the limit counts
//!   whole (in the sliding window counter's next window too), and a refund or a give-back
//!   takes its units off the count with its debt.
//! - **TTL on every write** (`SET ... PX`) equal to the time until the state equals "absent"
//!   (GCRA: `TAT - now`; fixed window: until the window ends; rounded up to a ms), so idle
//!   keys disappear and no key is ever left without a TTL. A denial writes nothing.
//!   [`RedisStoreBuilder::min_ttl`] sets a floor (for injected time, whose TTLs Redis still
//!   counts down in real time).
//! - **A policy and key charged twice in one request** (a duplicate charge) is cumulative, as
//!   in the memory store: each charge is judged on the state the earlier ones left, a total
//!   above the capacity can never fit ([`Outcome::CannotFit`](crate::Outcome::CannotFit),
//!   except for GCRA reservations, which book one turn per charge), and a refused charge
//!   keeps that judgement's `retry_after` (until the whole request fits) while reporting
//!   the key's state as it is. Refunds give back latest charge first.
//! - **All-or-nothing**: within one client key the script charges every policy or none.
//!   Charges for different client keys (different slots) are checked one key group after the
//!   other; when a later group denies, the groups already charged are refunded with the
//!   receipts they just took (reserve-then-refund).
//!
//! # Bans
//!
//! A policy with a [`Ban`](crate::Ban) keeps, per client key, its ban in a key of its own,
//! `<prefix>:v2:{<client key>}:ban:<policy>` (the limiter key's hash tag, so the same Cluster
//! slot), holding `"<until>:<first>:<count>"` in µs: the ban's end, and the start and size
//! of the running count of refusals. The script decides it atomically with the check, as
//! the memory store does: a ban in force refuses the whole call before anything is charged
//! (`retry_after` = its end − now, `remaining` 0; a reservation's refusal is final when the
//! ban ends after `max_wait`); a denial that refuses the request counts one refusal for
//! each denied policy with a ban, and the refusal that reaches the ban's count starts it.
//! Every write of the ban key sets `PX` to what remains of the ban or of the count,
//! whichever lasts longer (rounded up to a ms, at least [`RedisStoreBuilder::min_ttl`]),
//! so a ban key outlives neither. A ban is the fleet's: every instance on the same Redis
//! reads it. Calls whose policies have no ban send nothing more and read no ban key. The
//! negative cache remembers, for a policy with a ban, only answers of a ban in force (until
//! its end): its refusals must reach Redis to be counted.
//!
//! # Sliding log
//!
//! One sorted set per (policy, client key), `rl:v2:{<client key>}:<policy>`, one member
//! `"<ts>:<units>:<end>"` per log entry scored by its timestamp `ts` (µs), where `end` is the
//! running total of units through the entry (as the memory store's `SlidingLogState`), so a
//! request of cost `n` adds one entry, not `n` (charges at one instant merge into one
//! entry). The decision is
//! the memory store's, in µs, over the window `(now - W, now]` (an entry stops counting at
//! `ts + W`):
//!
//! ```text
//! used        = units of the entries with ts + W > now
//! allowed     = used + n <= limit           // then merge into the newest entry if it is
//!                                           // stamped now or later, else add (now, n)
//! retry_after = ts_k + W - now               // k: first entry (oldest first) at which the
//!                                           // units expired so far reach used + n - limit
//! remaining   = limit - used'                // used' after the charge
//! reset_after = newest ts + W - now (at most W), 0 when empty
//! ```
//!
//! `n > limit` can never fit; `n = 0` passes and writes nothing. With the running totals,
//! `used` is `end(newest) - end(oldest live) + units(oldest live)`: a check reads the oldest
//! live and the newest member (O(log e) each for `e` members), and a denial finds entry `k`
//! by a binary search over ranks (O(log² e)), never the whole log; a refund rewrites the
//! entries after the refunded one (usually none). An empty log starts its totals at 0.
//! A write drops the expired members and sets `PX` to the time until the newest entry
//! expires (`ts + W - now`, rounded up to a ms), so the set disappears with its last entry.
//! It is all-or-nothing with the key's other policies (same script call). The receipt stamp
//! is the entry's timestamp (µs); a refund takes at most its units off that entry while
//! `ts + W > now`, and nothing after.
//!
//! # Reservations (Delay mode)
//!
//! [`Store::reserve`] books the request's turn in one script call (`reserve` mode), the twin
//! of the memory store's [`MemoryStore::reserve_now`](crate::store::MemoryStore::reserve_now),
//! all-or-nothing across the key's policies:
//!
//! ```text
//! GCRA:  tat = max(stored TAT, now)   // read as stored: turns already booked count
//!        new_tat = tat + n * T; wait = max(new_tat - tau - now, 0)
//!        wait <= max_wait: reserved, TAT := new_tat, delay = wait
//!        otherwise: denied, final, retry_after = wait - max_wait
//! leaky bucket (shaper): tat = min(max(stored, now), now + tau); delay = tat - now
//!        queued when the meter allows and delay <= max_wait, else denied, final, with
//!        retry_after = max(meter's retry_after, delay - max_wait); a stored TAT beyond
//!        now + tau (a correction's debt: the shaper never queues that far) is read as
//!        stored, its denial waiting the debt out
//! windows, sliding log: a check (allowed now, or a denial that is not final)
//! ```
//!
//! The request's delay is the longest of its policies'. A reserved request is already
//! charged; its receipts give the turn back if the waiter is dropped ([`Store::refund`]): the
//! whole slot when it is still the latest booking, nothing while a later reservation waits
//! behind it (so a newcomer never takes someone else's turn). A GCRA state now records its
//! `tau` (`"<TAT>:<T>:<tau>"`): under unchanged parameters a TAT beyond `now + tau` is
//! booked turns and is read as stored; a state written under another `tau` (or by an earlier
//! deploy, `"<TAT>:<T>"`) is clamped to `now + tau` as before. Reservations skip the negative
//! cache, and one that books a turn forgets what it remembered for its keys. Denials of several client keys undo the keys already reserved (their bookings are
//! the latest, so the refund gives the whole slot back).
//!
//! # Concurrency slots
//!
//! [`RedisStore::slots`] gives [`RedisSlots`]: per client key a sorted set of slot ids
//! scored by lease expiry (Redis `TIME`, ms), `rl:v2:{<client key>}:conc:<name>`. A slot is
//! taken in one script call when fewer than `max` unexpired leases are held; the lease
//! (default 2.5 s) is renewed every `lease / 5` while the request runs and released when the
//! response body ends (or when the acquire's future is dropped before it answers), so the
//! slots of an instance that dies free themselves at most `lease` after its death, and a
//! live holder paused for up to `lease * 4 / 5` keeps them. Every write sets `PX = lease`.
//! The keyed concurrency layer of
//! `ratekeeper-tower` uses them through its `shared` builder option.
//!
//! # At start
//!
//! [`RedisStoreBuilder::standalone`] and [`RedisStoreBuilder::cluster`] return a **ready**
//! store: connected, every script and the function library loaded (`SCRIPT LOAD`,
//! `FUNCTION LOAD` on Redis 7, on every primary of a Cluster) and
//! Redis `TIME` read (the stale guard's offset), retried for up to
//! [`RedisStoreBuilder::connect_timeout`] (default 5 s). So the first decisions after a start
//! cost one round trip each, like every later one: they never have to connect or load a
//! script inside their deadline, and first-use latency is not taken for a store failure.
//! When Redis is not ready in time the build fails with [`StoreError::Unavailable`], unless
//! [`RedisStoreBuilder::require_ready`] is off: then the store starts answering with its
//! failure policy (logged at WARN) and connects in the background.
//!
//! # When Redis fails
//!
//! Every decision has a deadline (default 50 ms). When Redis is slow, down or answers an
//! error, the [`FailurePolicy`](crate::store::FailurePolicy) given to
//! [`RedisStoreBuilder::on_failure`] decides: `Allow` (fail open, the default), `Deny` (the
//! layer answers 503), `Local` (an in-memory store with the same or overridden policies
//! decides: each instance applies the whole quota, so `N` instances admit up to `N` × the
//! quota), `FailSoft` (each instance enforces its share of the fleet's quota in memory: the
//! policies divided by the number of instances, configured with
//! [`RedisStoreBuilder::instances`] or learned from the instances registered in Redis) or
//! `Degrade` (the degraded-response fallback serves the request). Each such decision is
//! counted ([`RedisStats::degraded`] and the `ratekeeper_store_degraded_total` counter of the
//! [`metrics`] crate, label `action`). Every decision's round trip is timed in the
//! `ratekeeper_store_latency_seconds` histogram (label `outcome`: `ok` or `error`, a timeout
//! included), and every failure counted in `ratekeeper_store_errors_total`.
//!
//! A **circuit breaker** opens after 3 failures in a row: for the next 500 ms (configurable)
//! decisions go straight to the failure policy without waiting on Redis; after that one
//! request at a time probes Redis. From the first failure, a **prober** runs in the
//! background: it opens a fresh connection, makes it ready (scripts loaded, `TIME` read,
//! within the deadline) and, when Redis answers, puts it in use and closes the breaker;
//! otherwise it tries again every half deadline (between 5 and 50 ms). So the connection is
//! re-established before anything probes on it, a Redis restart costs no request a dead
//! connection, and the failure-policy window ends within about a deadline and a probe pause
//! of the fault's end (a pause, a restart, or a Cluster failover once a replica is promoted:
//! the prober reads the slot map anew and loads the scripts on every primary).
//!
//! The outage's log: WARN at its first degraded decision (at once, with the error and the
//! failure policy in force; at most one such line per 10 s), WARN when the breaker opens
//! (the failures in a row), INFO when it closes (how many decisions the failure policy
//! answered meanwhile), DEBUG for each probe and each later degraded decision.
//!
//! A **stale guard** makes a check that reaches Redis later than its deadline plus
//! [`RedisStoreBuilder::stale_tolerance`] do nothing, so requests already answered by the
//! failure policy are not charged a second time when a paused Redis resumes. The guard is in
//! Redis time: each reply carries Redis `TIME`, the store keeps the offset between that and
//! its own monotonic clock, and sends each call's guard as "sent + offset + deadline +
//! tolerance". The app's wall clock is never read for it, so an app clock any amount behind or
//! ahead of Redis's is tolerated. Before the first reply there is no guard.
//!
//! A **negative cache** answers floods locally: after a denial, the same request (same
//! policies, keys and costs) is denied without a round trip, for every algorithm, until the
//! earliest instant at which Redis's answer could differ (`retry_after`, or sooner when a
//! sliding window frees a unit of `remaining` or a log entry expires), with the answer Redis
//! would give then, headers included. An allowed lone charge that took the last units is
//! remembered as the denial it implies (GCRA, leaky bucket, fixed window). A charge, a
//! reservation, a refund or a correction sent through this store forgets the entries of its
//! keys; charges by other instances only keep a denial a denial; a refund or a give-back by
//! another instance
//! can free a key sooner, and the remembered denial then lasts at most until the state it
//! was read from would have freed the key by itself. A reset (an unban) through any
//! instance reaches every instance's negative cache at once, through Redis pub/sub (see
//! [`RedisStore::reset_async`]). When a remembered denial runs out, one
//! request per key probes Redis and the others of that key on this instance wait for its
//! answer (within the deadline; one still waiting then is the failure policy's, without a
//! call of its own), so a flood of one key costs each instance at most one round trip at a
//! time and cannot push the store past its deadline by itself.
//!
//! # Example
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use ratekeeper_core::store::redis::RedisStore;
//! use ratekeeper_core::store::{FailurePolicy, Store};
//! use ratekeeper_core::{Key, Policy, Quota};
//!
//! # struct Server(std::process::Child);
//! # impl Drop for Server {
//! #     fn drop(&mut self) { let _ = self.0.kill(); let _ = self.0.wait(); }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # // A throwaway redis-server on a free loopback port, killed at the end.
//! # let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
//! # let _server = Server(std::process::Command::new("redis-server")
//! #     .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
//! #     .stdout(std::process::Stdio::null())
//! #     .spawn()?);
//! # for _ in 0..500 {
//! #     if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() { break; }
//! #     std::thread::sleep(Duration::from_millis(10));
//! # }
//! # let url = format!("redis://127.0.0.1:{port}/");
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let mut store = RedisStore::builder()
//!     .deadline(Duration::from_millis(50))
//! #   .deadline(Duration::from_secs(5)) // the doc test on a loaded machine: no timeouts
//!     .on_failure(FailurePolicy::Local)
//!     .standalone(&url) // for example "redis://127.0.0.1:6379/"
//!     .await?;
//! let quota = Quota::per_minute(NonZeroU32::new(2).unwrap());
//! let api = store.register(&Policy::new("api", quota))?;
//! let alice = Key::from("alice");
//! assert_eq!(store.redis_key(api, &alice).as_deref(), Some("rl:v2:{s:alice}:api"));
//!
//! let first = store.check_async(&[(api, alice.clone(), 1)]).await?;
//! assert_eq!(first.as_slice()[0].remaining(), 1);
//! store.check_async(&[(api, alice.clone(), 1)]).await?;
//! let third = store.check_async(&[(api, alice.clone(), 1)]).await?;
//! assert!(!third.is_allowed());
//! // T = 30 s: the next unit frees up 30 s after the first request (Redis TIME, µs).
//! let wait = third.retry_after().expect("denied now, not never");
//! assert_eq!(ratekeeper_core::ceil_secs(wait), 30);
//! assert_eq!(store.stats().degraded, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```

mod breaker;
mod builder;
mod check;
mod error;
mod failure;
mod group;
mod guard;
mod handle;
mod invalidate;
pub(crate) use invalidate::{Invalidated, Listener};
mod keys;
mod lease;
mod link;
pub(crate) use lease::LeaseGrant;
mod negative;
mod policy;
mod protocol;
mod reply;
mod reset;
mod script;
mod settle;
mod shared;
mod slots;
mod stats;
mod subscription;

pub use builder::RedisStoreBuilder;
pub use policy::MAX_TOLERANCE_MICROS;
pub use slots::RedisSlots;
pub use stats::RedisStats;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use failure::Failover;
use handle::Registry;
use policy::RedisPolicy;
use shared::Shared;
use smallvec::SmallVec;

use super::{Charge, Checked, Correction, Decisions, PolicyId, Refund, Store, StoreError};
use crate::{Key, Policy};

/// One owned charge: policy, client key, cost. What [`RedisStore::check_async`] takes.
pub type OwnedCharge = (PolicyId, Key, u64);

/// The charges a check future owns (one or two without a heap block).
type Owned = SmallVec<[OwnedCharge; 2]>;

/// The future of a Redis check (boxed: the Redis path does I/O anyway).
pub type RedisCheck = Pin<Box<dyn Future<Output = Result<Decisions, StoreError>> + Send>>;

/// Per-key state in Redis, shared by every app instance that uses the same Redis and prefix.
///
/// Built with [`RedisStore::builder`]; see the [module docs](self) for the script, keys,
/// TTLs, receipts, time, failure policy, breaker and negative cache. Supports
/// [`Algorithm::Gcra`](crate::Algorithm::Gcra),
/// [`Algorithm::LeakyBucket`](crate::Algorithm::LeakyBucket) (a meter when checked, a
/// shaper when reserved),
/// [`Algorithm::FixedWindow`](crate::Algorithm::FixedWindow),
/// [`Algorithm::SlidingWindow`](crate::Algorithm::SlidingWindow) and
/// [`Algorithm::SlidingLog`](crate::Algorithm::SlidingLog); the concurrency counter is
/// refused at build time with [`StoreError::UnsupportedAlgorithm`] (use
/// [`RedisStore::slots`]). [`Store::reserve`] reserves exactly for GCRA and the leaky bucket.
///
/// # Runtime
///
/// Checks run on the tokio runtime that polls them and need its I/O and time drivers
/// (`#[tokio::main]` and `axum::serve` have both); tokio panics when a timer is created on a
/// runtime built without `enable_time`, so build custom runtimes with `enable_all()`.
/// [`Store::refund`] spawns its Redis call on the current runtime (outside one it is dropped
/// with a warning).
///
/// # Clones
///
/// A clone is a handle on the same store: one connection (or Cluster client), the scripts
/// loaded once, one circuit breaker, negative cache, failure policy and set of counters,
/// and one registry of policies. A policy registered through any clone, at any time, is
/// known to every clone (a handle made before the registration refreshes its list on the
/// first call that needs it). Build the store once per process and give each layer a clone:
/// a second layer opens no connection and loads no script.
pub struct RedisStore {
    /// The policies as this handle knows them (the registry in `shared` has every one);
    /// shared with the check futures (the negative cache reads them).
    policies: Arc<Vec<RedisPolicy>>,
    failover: Failover,
    local_policies: Arc<Vec<Policy>>,
    shared: Arc<Shared>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("policies", &self.policies)
            .field("on_failure", &self.failover.policy)
            .field("deadline", &self.shared.deadline)
            .finish_non_exhaustive()
    }
}

pub(super) use crate::clock::nanos;

impl RedisStore {
    /// A builder with the defaults: prefix `rl`, deadline 50 ms, stale tolerance 100 ms,
    /// [`FailurePolicy::Allow`](crate::store::FailurePolicy::Allow), breaker 3 failures /
    /// 500 ms, negative cache on, Redis `TIME`.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder::default()
    }

    /// The decision deadline of each Redis call.
    pub(crate) fn deadline(&self) -> Duration {
        self.shared.deadline
    }

    /// Counters since the store was built.
    pub fn stats(&self) -> RedisStats {
        let s = &self.shared;
        RedisStats {
            redis_decisions: s.redis_decisions.load(Ordering::Relaxed),
            negative_cache_hits: s.negative_hits.load(Ordering::Relaxed),
            degraded: s.degraded.load(Ordering::Relaxed),
            errors: s.errors.load(Ordering::Relaxed),
        }
    }

    /// Whether the circuit breaker is open (Redis is being skipped).
    pub fn is_breaker_open(&self) -> bool {
        self.shared.breaker.is_open()
    }

    /// Whether the store has a ready connection (made when built, or by the prober after a
    /// fault) and its circuit breaker is closed: decisions go to Redis.
    pub fn is_ready(&self) -> bool {
        self.shared.script.conn.link().is_connected() && !self.shared.breaker.is_open()
    }

    /// The SHA1 digests of every script the store loads into Redis when it connects (what
    /// Redis `SCRIPT EXISTS` finds once the store is ready), as lower-case hex.
    pub fn script_hashes() -> Vec<String> {
        link::script_hashes()
    }

    /// The Lua text of the limiter and of the lease as `EVAL` scripts, in that order, for
    /// benchmarks and tests that call them from a bare client. Not a stable API: their
    /// arguments follow the store's private protocol, which changes with the crate.
    #[doc(hidden)]
    pub fn script_texts() -> [&'static str; 2] {
        let [limiter, lease, _, _] = protocol::scripts();
        [limiter, lease]
    }

    /// The number of app instances sharing this Redis as a fail-soft store last learned it
    /// (live registrations in Redis, this one included), the divisor of
    /// [`FailurePolicy::FailSoft`](crate::store::FailurePolicy::FailSoft); 0 for a store that
    /// does not learn it (another failure policy, or [`RedisStoreBuilder::instances`] set)
    /// and before the first reply.
    pub fn fleet_size(&self) -> u32 {
        self.shared.outage.instances.load(Ordering::Relaxed)
    }

    /// The Redis key of `policy` for `key`: `<prefix>:v2:{<encoded key>}:<policy name>`.
    /// `None` for an unknown policy.
    pub fn redis_key(&self, policy: PolicyId, key: &Key) -> Option<String> {
        if let Some(fresh) = self.refreshed() {
            return fresh.redis_key(policy, key);
        }
        let p = self.policies.get(policy.index())?;
        Some(keys::full(&self.shared.prefix, &keys::tag(key), &p.name))
    }

    /// Adds `listener`, told of every reset another instance (or this one) published and of
    /// every re-subscription of the invalidation channel (the tiered store drops its
    /// leases of what was reset).
    pub(crate) fn on_invalidate(&self, listener: Listener) {
        self.shared.invalidation.listen(listener);
    }

    /// Concurrency slots shared through this store's Redis (same connection, prefix,
    /// deadline and failure policy), for the keyed concurrency layer: see [`RedisSlots`]
    /// for the leases, their renewal and how fast a dead instance's slots free.
    pub fn slots(&self) -> RedisSlots {
        RedisSlots::new(
            self.shared.script.conn(),
            self.shared.prefix.clone(),
            self.shared.deadline,
            self.failover.policy,
        )
    }
}

impl Store<Key> for RedisStore {
    type Future = RedisCheck;

    /// Registers `policy` in the registry every clone of this store shares: its id is
    /// valid through every clone, made before or after.
    fn register(&mut self, policy: &Policy) -> Result<PolicyId, StoreError> {
        policy.validate()?;
        let redis_policy = RedisPolicy::new(policy)?;
        let mut latest = self.shared.lock_registry();
        let id = PolicyId::from_index(
            u32::try_from(latest.policies.len())
                .map_err(|_| StoreError::UnsupportedQuota("too many policies".to_owned()))?,
        );
        latest.failover.register(policy, &self.local_policies)?;
        self.shared
            .invalidation
            .register(Arc::clone(&redis_policy.name));
        Arc::make_mut(&mut latest.policies).push(redis_policy);
        self.shared
            .registered
            .store(latest.policies.len(), Ordering::Release);
        self.policies = Arc::clone(&latest.policies);
        self.failover = latest.failover.clone();
        Ok(id)
    }

    fn check(&self, charges: &[Charge<'_, Key>]) -> Checked<Self::Future> {
        let owned = charges
            .iter()
            .map(|c| (c.policy, c.key.clone(), c.cost))
            .collect();
        self.check_owned(owned)
    }

    /// Reserves exactly for GCRA and the leaky bucket (see the module docs,
    /// "Reservations"); the other algorithms check, and their denials are not final.
    fn reserve(&self, charges: &[Charge<'_, Key>], max_wait: Duration) -> Checked<Self::Future> {
        let owned = charges
            .iter()
            .map(|c| (c.policy, c.key.clone(), c.cost))
            .collect();
        self.reserve_owned(owned, max_wait)
    }

    /// Spawns the refund on the current tokio runtime (dropped with a warning outside one);
    /// see [`RedisStore::refund_async`] for the rules.
    fn refund(&self, refunds: &[Refund<'_, Key>]) {
        self.refund_in_background(refunds);
    }

    /// See [`RedisStore::peek_async`].
    fn peek(&self, policy: PolicyId, key: &Key) -> Checked<Self::Future> {
        self.peek_owned(policy, key)
    }

    /// See [`RedisStore::reset_async`].
    fn reset(&self, policy: Option<PolicyId>, key: &Key) -> Checked<Self::Future> {
        self.reset_owned(policy, key)
    }

    /// Spawns the correction on the current tokio runtime (dropped with a warning outside
    /// one), within the decision deadline, a failure counted and logged as for refunds; see
    /// [`RedisStore::correct_async`] for the rules. Every algorithm the store runs gives back
    /// by the receipt and charges the extra without refusing, as the memory store does: a
    /// debt in a fixed window refuses until the window ends, and in a sliding window counter
    /// weighs whole in the next window; refunds and give-backs take off the count with its
    /// debt.
    fn correct(&self, corrections: &[Correction<'_, Key>]) {
        self.correct_in_background(corrections);
    }

    /// Redis `TIME` as learned from the latest reply (advanced on the app's monotonic clock),
    /// so epoch-style reset headers agree across app instances whatever their own clocks say;
    /// the app clock's wall time before the first reply; the injected clock's when decision
    /// time is injected.
    fn unix_now(&self) -> Duration {
        let s = &self.shared;
        if s.script.injected() {
            return s.clock.unix_now();
        }
        match s.script.guard.to_redis(s.script.app_micros()) {
            Some(us) => Duration::from_micros(us),
            None => s.app.unix_now(),
        }
    }
}
