use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::deadline::OverDeadline;
use super::key::{ClientKey, Origin};
use super::state::Shared;

/// A [`Layer`](tower_layer::Layer) that makes an HTTP client wait when the server said nothing is left.
///
/// Wraps any `Service<http::Request<B>>` that answers `http::Response<_>` and is `Clone`
/// (hyper's `Client`, a `tower::buffer::Buffer`, a `service_fn`). Clones of the layer, and
/// every service made from them, share one memory of what servers announced. See the
/// [module docs](super) for what is read and when a request waits.
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_tower::client::{OverDeadline, PoliteLayer};
///
/// let layer = PoliteLayer::new()
///     .max_wait(Duration::from_secs(30))
///     .over_deadline(OverDeadline::SendAnyway);
/// assert_eq!(layer.wait_for("http://127.0.0.1:3000"), None);
/// ```
pub struct PoliteLayer<K = Origin> {
    pub(super) key: Arc<K>,
    pub(super) max_wait: Duration,
    pub(super) over_deadline: OverDeadline,
    pub(super) shared: Arc<Shared>,
}

impl PoliteLayer {
    /// A layer keyed by [`Origin`], waiting at most 60 s, failing beyond that.
    pub fn new() -> Self {
        Self {
            key: Arc::new(Origin),
            max_wait: Duration::from_secs(60),
            over_deadline: OverDeadline::Fail,
            shared: Arc::default(),
        }
    }
}

impl Default for PoliteLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> PoliteLayer<K> {
    /// The longest a request waits before it is sent (default 60 s; `Duration::ZERO` never
    /// waits). A longer announced wait is handled as [`over_deadline`](Self::over_deadline)
    /// says.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ratekeeper_tower::client::PoliteLayer;
    ///
    /// let patient = PoliteLayer::new().max_wait(Duration::from_secs(300));
    /// # let _ = patient;
    /// ```
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = max_wait;
        self
    }

    /// What a request does when the announced wait is longer than
    /// [`max_wait`](Self::max_wait) (default [`OverDeadline::Fail`]).
    ///
    /// ```
    /// use ratekeeper_tower::client::{OverDeadline, PoliteLayer};
    ///
    /// let layer = PoliteLayer::new().over_deadline(OverDeadline::SendAnyway);
    /// # let _ = layer;
    /// ```
    #[must_use]
    pub fn over_deadline(mut self, over_deadline: OverDeadline) -> Self {
        self.over_deadline = over_deadline;
        self
    }

    /// Groups requests by `key` instead of by origin: a [`ClientKey`], such as a closure over
    /// the request head. The new layer starts with an empty memory.
    ///
    /// ```
    /// use ratekeeper_tower::client::PoliteLayer;
    ///
    /// // One budget per API token, as many APIs count.
    /// let layer = PoliteLayer::new().key(|p: &axum::http::request::Parts| {
    ///     let token = p.headers.get("authorization").and_then(|v| v.to_str().ok());
    ///     token.unwrap_or_default().to_owned()
    /// });
    /// # let _ = layer;
    /// ```
    pub fn key<K2: ClientKey>(self, key: K2) -> PoliteLayer<K2> {
        PoliteLayer {
            key: Arc::new(key),
            max_wait: self.max_wait,
            over_deadline: self.over_deadline,
            shared: Arc::default(),
        }
    }

    /// How long a request with `key` would wait if sent now, or `None` when it would go at
    /// once.
    ///
    /// ```
    /// use ratekeeper_tower::client::PoliteLayer;
    ///
    /// assert_eq!(PoliteLayer::new().wait_for("https://api.example.com:443"), None);
    /// ```
    pub fn wait_for(&self, key: &str) -> Option<Duration> {
        let now = Instant::now();
        self.shared.blocked_until(key, now).map(|until| until - now)
    }

    /// Forgets every announcement, so that the next requests go at once.
    ///
    /// ```
    /// use ratekeeper_tower::client::PoliteLayer;
    ///
    /// let layer = PoliteLayer::new();
    /// layer.clear();
    /// ```
    pub fn clear(&self) {
        self.shared.clear();
    }
}

impl<K> Clone for PoliteLayer<K> {
    fn clone(&self) -> Self {
        Self {
            key: Arc::clone(&self.key),
            max_wait: self.max_wait,
            over_deadline: self.over_deadline,
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K> fmt::Debug for PoliteLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoliteLayer")
            .field("max_wait", &self.max_wait)
            .field("over_deadline", &self.over_deadline)
            .finish_non_exhaustive()
    }
}
