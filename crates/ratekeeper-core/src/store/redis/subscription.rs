//! The fleet invalidation channel seen from the store (see [`super::invalidate`] for the
//! channel and its messages): applying an invalidation, publishing a reset, and the
//! subscription task that keeps the channel live.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, Weak};
use std::time::Duration;

use futures_util::StreamExt;

use super::invalidate::{Invalidated, PING_EVERY};
use super::shared::Shared;
use crate::Key;
use crate::store::PolicyId;

/// Pause between two attempts to subscribe.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// How long connecting and subscribing may take.
const SUBSCRIBE_WITHIN: Duration = Duration::from_secs(1);

impl Shared {
    /// Applies `what`: the negative cache forgets it, then the listeners are told.
    pub(super) fn invalidate(&self, what: &Invalidated) {
        self.invalidation.epoch.fetch_add(1, Ordering::AcqRel);
        if let Some(cache) = &self.negative {
            match what {
                Invalidated::All => cache.clear(),
                Invalidated::Key { .. } => cache.forget_where(|p, k| what.covers(p, k)),
            }
        }
        for listener in self
            .invalidation
            .listeners
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            listener(what);
        }
    }

    /// Tells every instance (this one included) that `key` was reset under `policy`
    /// (`None`: every policy), within the deadline; a failure is logged at DEBUG (the other
    /// instances then learn of the reset when their remembered denials run out).
    pub(super) async fn publish_reset(&self, policy: Option<PolicyId>, key: &Key) {
        self.publish(self.invalidation.message(policy, key)).await;
    }

    /// Publishes `message` on the invalidation channel within the deadline.
    async fn publish(&self, message: String) {
        let mut cmd = redis::cmd("PUBLISH");
        cmd.arg(&self.invalidation.channel).arg(message);
        let mut conn = self.script.conn.link().clone();
        let call = cmd.query_async::<i64>(&mut conn);
        match tokio::time::timeout(self.deadline, call).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => tracing::debug!(error = %err, "redis store: publishing failed"),
            Err(_) => tracing::debug!("redis store: publishing timed out"),
        }
    }

    /// Starts the subscription task on the current runtime (see the module docs); it ends
    /// when the store is dropped.
    pub(super) fn start_subscription(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.invalidation.targets.is_empty() {
            return;
        }
        let weak = Arc::downgrade(self);
        let mut stop = self.invalidation.stop.subscribe();
        let targets = self.invalidation.targets.clone();
        let channel = self.invalidation.channel.clone();
        runtime.spawn(async move {
            for attempt in 0usize.. {
                let Some(client) = targets.get(attempt % targets.len()) else {
                    return;
                };
                tokio::select! {
                    _ = stop.changed() => return,
                    () = session(&weak, client, &channel) => {}
                }
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                if shared.invalidation.live.swap(false, Ordering::AcqRel) {
                    tracing::debug!("redis store: invalidation channel lost; resubscribing");
                }
                shared.invalidation.attempt_ended();
                drop(shared);
                tokio::select! {
                    _ = stop.changed() => return,
                    () = tokio::time::sleep(RETRY_EVERY) => {}
                }
            }
        });
    }
}

/// One subscription: connects, subscribes, then applies each message until the connection
/// fails or a ping goes unanswered.
async fn session(weak: &Weak<Shared>, client: &redis::Client, channel: &str) {
    let subscribe = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok::<_, redis::RedisError>(pubsub)
    };
    let pubsub = match tokio::time::timeout(SUBSCRIBE_WITHIN, subscribe).await {
        Ok(Ok(pubsub)) => pubsub,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "redis store: subscribing to invalidations failed");
            return;
        }
        Err(_) => return,
    };
    let (mut sink, mut stream) = pubsub.split();
    // Live only once a message of its own came back on it (a subscription Redis refused,
    // for one, may not say so).
    let Some(shared) = weak.upgrade() else {
        return;
    };
    let hello = format!("hello:{}", shared.instance_id);
    shared.publish(hello.clone()).await;
    let heard = async {
        while let Some(message) = stream.next().await {
            let payload = message.get_payload_bytes();
            if payload == hello.as_bytes() {
                return true;
            }
            if let Some(what) = shared.invalidation.parse(payload) {
                shared.invalidate(&what);
            }
        }
        false
    };
    if !matches!(
        tokio::time::timeout(SUBSCRIBE_WITHIN, heard).await,
        Ok(true)
    ) {
        tracing::debug!("redis store: the invalidation channel did not deliver; retrying");
        return;
    }
    // Live from now on; what was remembered before may have missed an invalidation.
    shared.invalidation.live.store(true, Ordering::Release);
    shared.invalidate(&Invalidated::All);
    shared.invalidation.attempt_ended();
    drop(shared);
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = stream.next() => {
                let Some(message) = message else {
                    return;
                };
                let Some(shared) = weak.upgrade() else {
                    return;
                };
                if let Some(what) = shared.invalidation.parse(message.get_payload_bytes()) {
                    shared.invalidate(&what);
                }
            }
            _ = ping.tick() => {
                let pong = tokio::time::timeout(PING_EVERY, sink.ping::<redis::Value>()).await;
                if !matches!(pong, Ok(Ok(_))) {
                    return;
                }
            }
        }
    }
}
