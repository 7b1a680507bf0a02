//! [`Ticket`]: everything the layer learned about one request, in one value that moves from
//! `call` to the settlement after the response.

use std::sync::Arc;

use tokio::time::Instant;

use super::answer::Refusal;
use crate::policy::Applied;

/// One request as the layer knows it: made once in `call` (by the limiter's `prepare`), read
/// by every verdict on it, held by the response future while the request waits, and owned
/// by its settlement once the inner service answers it (a settlement has no type parameter,
/// so it can move on with the response).
#[derive(Debug)]
pub(crate) struct Ticket {
    /// The layer's key and the charges the store checks (and a settle rule may give back).
    pub(crate) charges: Applied,
    /// The hashed partition key (`pk`) the IETF headers carry, when it is on.
    pub(crate) pk: Option<Arc<str>>,
    /// [`Mode::Delay`](super::Mode::Delay): set at the request's first denial; a request that
    /// cannot pass by then is refused.
    pub(crate) deadline: Option<Instant>,
    /// Where a refusal goes (an answer, its gRPC form, or the fallback).
    pub(crate) refusal: Refusal,
}
