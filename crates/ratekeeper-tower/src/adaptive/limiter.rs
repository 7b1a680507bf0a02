//! One key's limit ([`Limiter`]): its controller and the requests in flight behind one
//! lock, its gauges, and the [`Permit`] an admitted request holds.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metrics::Gauge;

use super::controller::{ControllerSettings, GradientController, LimitChange};
use super::partition::{InFlight, Partitions};

/// One key's limit: the controller and the requests in flight, behind one lock, and its
/// gauges.
pub(crate) struct Limiter {
    state: Mutex<State>,
    gauges: Gauges,
}

struct State {
    controller: GradientController,
    in_flight: InFlight,
}

pub(super) struct Gauges {
    pub(super) limit: Gauge,
    pub(super) in_flight: Gauge,
    pub(super) latency: Gauge,
    pub(super) min_latency: Gauge,
}

/// What the layer admitted: released (and counted out of the partition) on drop.
pub(crate) struct Permit {
    limiter: Arc<Limiter>,
    partition: usize,
    started: u64,
    in_flight: u32,
    name: Arc<str>,
}

impl Limiter {
    pub(super) fn new(
        settings: ControllerSettings,
        seed: u64,
        now: u64,
        partitions: usize,
        gauges: Gauges,
    ) -> Self {
        let controller = GradientController::new(settings, seed, now);
        gauges.limit.set(f64::from(controller.limit()));
        Self {
            state: Mutex::new(State {
                controller,
                in_flight: InFlight::new(partitions),
            }),
            gauges,
        }
    }

    /// A poisoned lock only means a panic elsewhere while it was held; the state is still
    /// consistent (every update is a few plain assignments), so it is used as it is.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn try_admit(
        self: &Arc<Self>,
        partition: usize,
        partitions: &Partitions,
        now: u64,
        name: &Arc<str>,
    ) -> Option<Permit> {
        let mut state = self.lock();
        let change = state.controller.tick(now);
        let limit = state.controller.limit();
        let admitted = state.in_flight.try_admit(partition, limit, partitions, now);
        let in_flight = state.in_flight.total;
        drop(state);
        if let Some(change) = change {
            self.report_change(change, name, None);
        }
        if !admitted {
            return None;
        }
        self.gauges.in_flight.set(f64::from(in_flight));
        Some(Permit {
            limiter: Arc::clone(self),
            partition,
            started: now,
            in_flight,
            name: Arc::clone(name),
        })
    }

    fn report_change(&self, change: LimitChange, name: &str, latency: Option<(u64, Option<u64>)>) {
        self.gauges.limit.set(f64::from(change.to));
        let (latency_ms, min_latency_ms) = match latency {
            Some((l, m)) => (l as f64 / 1e6, m.map_or(f64::NAN, |m| m as f64 / 1e6)),
            None => (f64::NAN, f64::NAN),
        };
        tracing::debug!(
            name,
            from = change.from,
            to = change.to,
            latency_ms,
            min_latency_ms,
            "adaptive concurrency limit changed"
        );
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        Snapshot {
            limit: state.controller.limit(),
            in_flight: state.in_flight.total,
            in_flight_by_partition: state.in_flight.by_partition.to_vec(),
            min_latency: state.controller.min_rtt_ns().map(Duration::from_nanos),
            latency: state.controller.sample_rtt_ns().map(Duration::from_nanos),
            measuring: state.controller.is_measuring(),
        }
    }
}

impl Permit {
    /// Records the request's latency (admission to response at `now`, ns).
    pub(crate) fn sample(&self, now: u64) {
        self.record(now, true);
    }

    /// Records a request that got no response (the service failed, or the request was
    /// dropped) at `now` (ns): its elapsed time ([`GradientController::failure`]).
    pub(crate) fn failure(&self, now: u64) {
        self.record(now, false);
    }

    fn record(&self, now: u64, answered: bool) {
        let latency = now.saturating_sub(self.started);
        let mut state = self.limiter.lock();
        let c = &mut state.controller;
        let change = if answered {
            c.sample(latency, self.started, self.in_flight, now)
        } else {
            c.failure(latency, self.started, self.in_flight, now)
        };
        let estimate = state.controller.sample_rtt_ns();
        let min = state.controller.min_rtt_ns();
        drop(state);
        if let Some(change) = change {
            let g = &self.limiter.gauges;
            if let Some(e) = estimate {
                g.latency.set(e as f64 / 1e9);
            }
            if let Some(m) = min {
                g.min_latency.set(m as f64 / 1e9);
            }
            self.limiter
                .report_change(change, &self.name, estimate.map(|e| (e, min)));
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.limiter.lock();
        state.in_flight.release(self.partition);
        let total = state.in_flight.total;
        drop(state);
        self.limiter.gauges.in_flight.set(f64::from(total));
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("partition", &self.partition)
            .field("started_ns", &self.started)
            .finish_non_exhaustive()
    }
}

/// The state of one key's limit, from [`ConcurrencyLimitLayer::snapshot`](crate::concurrency::ConcurrencyLimitLayer::snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Requests that may be in flight now.
    pub limit: u32,
    /// Requests in flight now (admitted, response body not ended).
    pub in_flight: u32,
    /// Requests in flight per partition, in the order the partitions were declared.
    pub in_flight_by_partition: Vec<u32>,
    /// The measured minimum latency, once measured.
    pub min_latency: Option<Duration>,
    /// The latency estimate of the last update interval that had requests.
    pub latency: Option<Duration>,
    /// Whether the minimum latency is being measured (the limit is then the lowest).
    pub measuring: bool,
}
