//! [`OverDeadline`]: what a request does when its wait would be too long.

/// What a request does when the server asked for a longer wait than
/// [`PoliteLayer::max_wait`](super::PoliteLayer::max_wait) allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OverDeadline {
    /// Fail at once with [`Error::WaitTooLong`](super::Error::WaitTooLong), without sending
    /// (the default): the caller decides whether to give up, queue the work or tell its user.
    #[default]
    Fail,
    /// Send at once, as if nothing had been announced (the server will most likely refuse
    /// it again, and its answer renews the wait).
    SendAnyway,
}
