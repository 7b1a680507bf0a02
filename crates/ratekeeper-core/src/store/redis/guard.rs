//! The stale-call guard, in Redis time only (one time source).
//!
//! A script call that reaches Redis after its caller gave up (the decision deadline passed
//! and the failure policy already answered) must do nothing, or a paused Redis that resumes
//! would charge requests a second time. Redis can only judge "too late" against its own
//! clock, so the guard is sent in the Redis time domain:
//!
//! ```text
//! offset = server_time - sent             // learned from every reply (µs)
//! guard  = sent + offset + deadline + tolerance
//! ```
//!
//! where `sent` is the app's **monotonic** clock when the call was sent and `server_time` the
//! Redis `TIME` a reply carries. The app's wall clock never takes part, so an app clock that
//! is any amount behind or ahead of Redis changes nothing. The learned offset includes the
//! one-way latency of the call it came from, so it errs towards a later guard (a late call
//! may still run), never towards calling a timely call stale. Until a first reply has taught
//! an offset there is no guard. A Redis clock that steps forward between two replies makes
//! calls look stale until the next reply (every reply, a stale one too, re-calibrates).

use std::sync::atomic::{AtomicI64, Ordering};

/// No offset learned yet.
const UNKNOWN: i64 = i64::MIN;

/// The learned offset between the app's monotonic clock and Redis `TIME`, and the allowance
/// after which a call is stale.
#[derive(Debug)]
pub(super) struct Guard {
    /// `server_time - sent` of the latest reply, µs; [`UNKNOWN`] before the first.
    offset: AtomicI64,
    /// Deadline plus tolerance, µs.
    allowance: u64,
}

impl Guard {
    /// A guard that calls a call stale `allowance_us` after it was sent.
    pub(super) const fn new(allowance_us: u64) -> Self {
        Self {
            offset: AtomicI64::new(UNKNOWN),
            allowance: allowance_us,
        }
    }

    /// How long after it was sent a call may still reach Redis and run (deadline plus
    /// tolerance), µs.
    pub(super) const fn allowance(&self) -> u64 {
        self.allowance
    }

    /// The guard for a call sent at `sent_us` (app monotonic µs), in Redis `TIME` µs; `None`
    /// (no guard) until an offset is known.
    pub(super) fn limit(&self, sent_us: u64) -> Option<u64> {
        let redis_sent = self.to_redis(sent_us)?;
        Some(redis_sent.saturating_add(self.allowance))
    }

    /// `at_us` on the app's monotonic clock as Redis `TIME` µs; `None` until an offset is
    /// known.
    pub(super) fn to_redis(&self, at_us: u64) -> Option<u64> {
        let offset = self.offset.load(Ordering::Relaxed);
        if offset == UNKNOWN {
            return None;
        }
        let at = i128::from(at_us) + i128::from(offset);
        Some(u64::try_from(at.max(0)).unwrap_or(u64::MAX))
    }

    /// Learns from a reply: the call was sent at `sent_us` (app monotonic µs) and Redis read
    /// `server_us` (Redis `TIME` µs) while running it.
    pub(super) fn learn(&self, sent_us: u64, server_us: u64) {
        let offset = (i128::from(server_us) - i128::from(sent_us))
            .clamp(i128::from(UNKNOWN + 1), i128::from(i64::MAX));
        let offset = i64::try_from(offset).unwrap_or(i64::MAX);
        self.offset.store(offset, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis TIME around now in µs; app monotonic clocks start near 0.
    const REDIS_NOW: u64 = 1_800_000_000_000_000;

    #[test]
    fn no_guard_until_a_reply_taught_the_offset() {
        let g = Guard::new(50_000);
        assert_eq!(g.limit(1_000), None);
        g.learn(1_000, REDIS_NOW);
        assert_eq!(g.limit(1_000), Some(REDIS_NOW + 50_000));
        // 2 s later on the app's monotonic clock: 2 s later in Redis time.
        assert_eq!(g.limit(2_001_000), Some(REDIS_NOW + 2_000_000 + 50_000));
    }

    #[test]
    fn the_app_wall_clock_plays_no_part_and_any_offset_works() {
        // Monotonic clocks with any origin, Redis far ahead or "behind" (a small TIME).
        for (sent, server) in [(0, REDIS_NOW), (u64::MAX / 2, 5), (7, 7)] {
            let g = Guard::new(10);
            g.learn(sent, server);
            assert_eq!(g.to_redis(sent), Some(server));
            assert_eq!(g.limit(sent), Some(server + 10));
        }
    }

    #[test]
    fn every_reply_recalibrates() {
        let g = Guard::new(0);
        g.learn(0, REDIS_NOW);
        // Redis's clock stepped 10 s forward: the next reply moves the guard with it.
        g.learn(1_000, REDIS_NOW + 10_001_000);
        assert_eq!(g.limit(2_000), Some(REDIS_NOW + 10_002_000));
    }
}
