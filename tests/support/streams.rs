//! Many streamed responses of one key, each reserving an estimate and settled from its body
//! (`usage::Usage::body`), interleaved step by step on any store: the driver of the
//! reserve-then-settle property tests (`tests/http/usage.rs` on memory,
//! `tests/redis/usage.rs` on Redis).
//!
//! The store's clock does not move during a run, so nothing refills and the units charged
//! are exact: after each step the driver reads them (a free probe: a charge of 0 units;
//! GCRA's `reset_after` is the charged units × the emission interval) and compares them
//! with a model. A store that settles asynchronously (Redis) is given a bounded time to
//! agree.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{Request, Response, StatusCode};
use http_body::{Body, Frame};
use proptest::prelude::*;
use ratekeeper_axum::body::ResponseBody;
use ratekeeper_axum::core::store::{Charge, Checked, Store};
use ratekeeper_axum::usage::{BodyEvent, Usage};
use ratekeeper_axum::{
    RateLimitLayer, RequestParts, core::Key, core::Policy, core::Quota, key::KeyError,
};
use tower::{Layer, Service};

/// One streamed response: the units it reserves, the units of each body frame it sends,
/// and whether the client drops it after that many frames instead of reading to its end.
#[derive(Debug, Clone)]
pub struct Stream {
    /// The estimate charged when the request arrives (units, at least 1).
    pub estimate: u64,
    /// The units of each data frame (a frame of `n` bytes is `n` units).
    pub frames: Vec<u64>,
    /// `Some(n)`: the client reads `n` frames (at most `frames.len()`), then drops the body.
    pub dropped_after: Option<usize>,
}

impl Stream {
    /// Frames read before the body ends or is dropped.
    fn read(&self) -> usize {
        self.dropped_after
            .map_or(self.frames.len(), |n| n.min(self.frames.len()))
    }

    /// The steps of this stream: the request, one per frame read, then the end or the drop.
    pub fn steps(&self) -> usize {
        self.read() + 2
    }

    /// The true cost: the units of the frames read.
    pub fn actual(&self) -> u64 {
        self.frames.iter().take(self.read()).sum()
    }
}

/// A run: `capacity` units (never refilled), the streams of one key, and the order of
/// their steps (each stream's index appears [`Stream::steps`] times; its `k`-th appearance
/// is its `k`-th step).
#[derive(Debug, Clone)]
pub struct Scenario {
    /// The policy's capacity (burst) in units.
    pub capacity: u32,
    /// The streams.
    pub streams: Vec<Stream>,
    /// The interleaving.
    pub order: Vec<usize>,
}

impl Scenario {
    /// The order in which every stream's steps run one after the other (`order` for a
    /// shuffle to start from).
    pub fn sequential(streams: &[Stream]) -> Vec<usize> {
        streams
            .iter()
            .enumerate()
            .flat_map(|(i, s)| std::iter::repeat_n(i, s.steps()))
            .collect()
    }

    /// The largest correction above an estimate (0 when every estimate is an upper bound).
    pub fn largest_extra(&self) -> u64 {
        self.streams
            .iter()
            .map(|s| s.actual().saturating_sub(s.estimate))
            .max()
            .unwrap_or(0)
    }
}

/// What a run saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Streams admitted (the others got a 429).
    pub admitted: usize,
    /// Units charged once every stream settled.
    pub charged: u64,
    /// The sum of the admitted streams' true costs.
    pub actual: u64,
    /// The most units ever charged beyond the capacity.
    pub overshoot: u64,
    /// The most requests in flight at an admission.
    pub in_flight: usize,
}

/// A response body of prepared frames; after them it ends, or (`hang`) waits for ever. It
/// never says it ended before it is polled past its last frame (as a stream of events).
struct Frames {
    frames: VecDeque<Frame<Bytes>>,
    hang: bool,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.frames.pop_front() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None if self.hang => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

/// The request of one stream: its estimate in a header, its frames in an extension.
#[derive(Clone)]
struct Planned(Stream);

/// The estimate of a request (the `estimate` header).
fn estimate(req: &RequestParts<'_>) -> u64 {
    req.headers()
        .get("estimate")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// One unit per byte of data.
fn bytes() -> Usage {
    Usage::body(|_head| {
        let mut units = 0u64;
        move |event: BodyEvent<'_>| {
            if let BodyEvent::Data(data) = event {
                units += data.len() as u64;
            }
            units
        }
    })
}

/// Units charged to `key` under the layer's only policy, read without charging: GCRA's
/// `reset_after` over the emission interval `t_ns`, rounded to the nearest unit.
async fn charged<St: Store<Key>>(store: &St, key: &Key, t_ns: u128) -> Result<u64, String> {
    let policy = ratekeeper_axum::core::store::PolicyId::from_index(0);
    let probe = [Charge::new(policy, key, 0)];
    let decisions = match store.check(&probe) {
        Checked::Ready(result) => result,
        Checked::Pending(future) => future.await,
    }
    .map_err(|e| format!("probe failed: {e}"))?;
    let reset = decisions.as_slice()[0].reset_after().as_nanos();
    u64::try_from((reset + t_ns / 2) / t_ns).map_err(|e| e.to_string())
}

/// Runs `scenario` for `key` through a layer with `store` (its clock must not move), one
/// policy of `scenario.capacity` units, one unit per 1 000 s, GCRA; `settle_wait` bounds how long the
/// store may take to show a settlement (zero for a store that settles at once).
///
/// # Errors
///
/// A description of the first step at which the store disagreed with the model (a wrong
/// status, units charged other than the model's), or a store error.
pub async fn run<St: Store<Key>>(
    store: St,
    key: Key,
    scenario: &Scenario,
    settle_wait: Duration,
) -> Result<Outcome, String> {
    let capacity = u64::from(scenario.capacity);
    // One unit per 1 000 s (a whole µs, as the Redis store keeps time in µs).
    let period = Duration::from_secs(1000 * capacity);
    let quota = Quota::new(scenario.capacity, period).map_err(|e| e.to_string())?;
    let t_ns = u128::from(quota.emission_interval_nanos());
    let layer_key = key.clone();
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("units", quota))
        .key(move |_: &RequestParts<'_>| Ok::<_, KeyError>(layer_key.clone()))
        .cost_fn(estimate)
        .usage("units", bytes())
        .store(store)
        .build()
        .map_err(|e| e.to_string())?;
    let store = layer.store();
    let mut svc = layer.layer(tower::service_fn(|req: Request<()>| async move {
        let Some(Planned(stream)) = req.extensions().get::<Planned>().cloned() else {
            return Ok::<_, Infallible>(Response::new(Frames {
                frames: VecDeque::new(),
                hang: false,
            }));
        };
        let frames = stream
            .frames
            .iter()
            .map(|&n| Frame::data(Bytes::from(vec![b'x'; usize::try_from(n).unwrap_or(0)])))
            .collect();
        Ok(Response::new(Frames {
            frames,
            hang: stream.dropped_after.is_some(),
        }))
    }));

    let mut bodies: Vec<Option<ResponseBody<Frames>>> =
        scenario.streams.iter().map(|_| None).collect();
    let mut step_of = vec![0usize; scenario.streams.len()];
    let mut admitted = vec![false; scenario.streams.len()];
    let mut model = 0u64;
    let mut outcome = Outcome::default();
    let cx = &mut Context::from_waker(Waker::noop());

    for (n, &i) in scenario.order.iter().enumerate() {
        let stream = &scenario.streams[i];
        let step = step_of[i];
        step_of[i] += 1;
        if step == 0 {
            let req = Request::builder()
                .header("estimate", stream.estimate)
                .extension(Planned(stream.clone()))
                .body(())
                .map_err(|e| e.to_string())?;
            std::future::poll_fn(|cx| svc.poll_ready(cx))
                .await
                .map_err(|e: Infallible| e.to_string())?;
            let res = svc.call(req).await.map_err(|e| e.to_string())?;
            let fits = model + stream.estimate <= capacity;
            let want = if fits {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            if res.status() != want {
                return Err(format!(
                    "step {n}: stream {i} (estimate {}) got {} with {model} of {capacity} charged",
                    stream.estimate,
                    res.status()
                ));
            }
            if fits {
                model += stream.estimate;
                admitted[i] = true;
                bodies[i] = Some(res.into_body());
                let in_flight = bodies.iter().filter(|b| b.is_some()).count();
                outcome.in_flight = outcome.in_flight.max(in_flight);
            }
        } else if admitted[i] && step <= stream.read() {
            let Some(body) = bodies[i].as_mut() else {
                return Err(format!("step {n}: stream {i} has no body"));
            };
            match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) if frame.is_data() => {}
                other => return Err(format!("step {n}: stream {i}: {other:?} for a frame")),
            }
        } else if admitted[i] {
            let Some(mut body) = bodies[i].take() else {
                return Err(format!("step {n}: stream {i} ended twice"));
            };
            if stream.dropped_after.is_some() {
                drop(body);
            } else if let Poll::Ready(Some(_)) | Poll::Pending = Pin::new(&mut body).poll_frame(cx)
            {
                return Err(format!("step {n}: stream {i} did not end"));
            }
            // The model held this stream's estimate: settled to its true cost.
            model = model - stream.estimate + stream.actual();
            outcome.actual += stream.actual();
        }
        // The store agrees with the model (given time to settle).
        let mut waited = Duration::ZERO;
        let seen = loop {
            let seen = charged(store, &key, t_ns).await?;
            if seen == model || waited >= settle_wait {
                break seen;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
            waited += Duration::from_millis(2);
        };
        if seen != model {
            return Err(format!(
                "step {n} (stream {i}, its step {step}): {seen} units charged, {model} expected"
            ));
        }
        outcome.overshoot = outcome.overshoot.max(seen.saturating_sub(capacity));
    }
    outcome.admitted = admitted.iter().filter(|a| **a).count();
    outcome.charged = model;
    Ok(outcome)
}

/// A stream: estimate 1–60, up to 4 frames of 0–40 units, dropped after 0–4 frames one time
/// in three; with `upper_bounds`, frames cut so the true cost never exceeds the estimate.
pub fn stream(upper_bounds: bool) -> impl Strategy<Value = Stream> {
    (
        1u64..=60,
        prop::collection::vec(0u64..=40, 0..=4),
        prop::option::weighted(0.3, 0usize..=4),
    )
        .prop_map(move |(estimate, mut frames, dropped_after)| {
            if upper_bounds {
                let mut left = estimate;
                for f in &mut frames {
                    *f = (*f).min(left);
                    left -= *f;
                }
            }
            Stream {
                estimate,
                frames,
                dropped_after,
            }
        })
}

/// 100 streams on a capacity of 200–3 000 units (so some are refused and some go into
/// debt), in a random interleaving of their steps.
pub fn scenario() -> impl Strategy<Value = Scenario> {
    (200u32..=3000, any::<bool>()).prop_flat_map(|(capacity, upper_bounds)| {
        prop::collection::vec(stream(upper_bounds), 100).prop_flat_map(move |streams| {
            let order = Scenario::sequential(&streams);
            Just(order).prop_shuffle().prop_map(move |order| Scenario {
                capacity,
                streams: streams.clone(),
                order,
            })
        })
    })
}

/// The properties every run holds: the units charged once all settled are the sum of the
/// admitted streams' true costs, and the overshoot stayed within the requests in flight ×
/// the largest correction above an estimate.
///
/// # Errors
///
/// The property that failed.
pub fn check(scenario: &Scenario, outcome: &Outcome) -> Result<(), TestCaseError> {
    prop_assert_eq!(outcome.charged, outcome.actual);
    let bound = outcome.in_flight as u64 * scenario.largest_extra();
    prop_assert!(
        outcome.overshoot <= bound,
        "overshoot {} beyond the bound {}",
        outcome.overshoot,
        bound
    );
    Ok(())
}
