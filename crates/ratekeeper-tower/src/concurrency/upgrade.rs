//! Upgrades (HTTP/1.1 `Upgrade`, WebSocket, `CONNECT` tunnels) and their concurrency slot.
//!
//! After a `101 Switching Protocols`, or the `2xx` answer to a `CONNECT` (a proxy tunnel, or
//! a WebSocket over HTTP/2 extended CONNECT, RFC 8441), the connection or stream belongs to
//! the handler's session: its end is not a response body ending, and nothing on the request path sees it (the upgraded
//! I/O goes to the handler through hyper's `OnUpgrade`, which this layer must leave in place
//! for WebSocket extractors to work). So the layer hands upgrade requests an [`UpgradeSlot`]
//! in their extensions, and a handler that accepts the upgrade moves the slot into the
//! session with [`UpgradeSlot::keep`]: the slot is then held until the returned
//! [`ConcurrencyPermit`] drops, that is until the session task ends.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use http::header::UPGRADE;
use http::{Method, Request};

use super::permit::Permit;

/// The concurrency slot of an upgrade request, in its extensions (see the
/// [module docs](super#upgrades-and-websocket-sessions)).
///
/// Present on requests with an `Upgrade` header field (a WebSocket handshake, say) and on
/// `CONNECT` requests (tunnels, WebSockets over HTTP/2) that the
/// [`ConcurrencyLimit`](super::ConcurrencyLimit) admitted. Unless a handler calls
/// [`UpgradeSlot::keep`], the slot is released when the response body ends, as for any
/// request, which for a `101` is as soon as it is sent.
#[derive(Clone)]
pub struct UpgradeSlot {
    cell: Arc<Mutex<Option<Permit>>>,
}

impl UpgradeSlot {
    /// Takes the slot out of the layer's hands: it stays taken until the returned permit is
    /// dropped (move it into the session task). `None` when it was kept already.
    pub fn keep(&self) -> Option<ConcurrencyPermit> {
        take(&self.cell).map(|permit| ConcurrencyPermit { _permit: permit })
    }
}

impl fmt::Debug for UpgradeSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self
            .cell
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("UpgradeSlot")
            .field("with_layer", &held)
            .finish()
    }
}

/// A concurrency slot a handler kept with [`UpgradeSlot::keep`]; released on drop.
#[derive(Debug)]
pub struct ConcurrencyPermit {
    _permit: Permit,
}

/// The slot of an admitted request, as the response future holds it.
pub(crate) enum Held {
    /// An ordinary request: the layer alone holds the slot.
    Own(Permit),
    /// An upgrade request: shared with the [`UpgradeSlot`] in its extensions.
    Shared(Arc<Mutex<Option<Permit>>>),
}

impl Held {
    /// The slot for `req`: shared through an [`UpgradeSlot`] extension when the request asks
    /// for an upgrade (an `Upgrade` header field, or `CONNECT`, which has none over HTTP/2),
    /// else owned. Ordinary requests pay one method comparison and one header lookup.
    pub(crate) fn for_request<B>(permit: Permit, req: &mut Request<B>) -> Self {
        if req.method() != Method::CONNECT && !req.headers().contains_key(UPGRADE) {
            return Self::Own(permit);
        }
        let cell = Arc::new(Mutex::new(Some(permit)));
        req.extensions_mut().insert(UpgradeSlot {
            cell: Arc::clone(&cell),
        });
        Self::Shared(cell)
    }

    /// What the response body holds: the slot, unless a handler kept it.
    pub(crate) fn into_permit(self) -> Option<Permit> {
        match self {
            Self::Own(permit) => Some(permit),
            Self::Shared(cell) => take(&cell),
        }
    }
}

fn take(cell: &Mutex<Option<Permit>>) -> Option<Permit> {
    cell.lock().unwrap_or_else(PoisonError::into_inner).take()
}
