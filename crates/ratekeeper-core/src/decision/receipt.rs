//! [`Receipt`]: what an allowed charge took, so a refund gives back only that.

use std::fmt;

/// What an allowed charge took, so that a refund gives back only what that charge still
/// holds (a refund after the window closed, the log entry expired or the bucket drained gives
/// back nothing; a refund never frees a slot booked by a later reservation).
///
/// The stamp is the store's, in the store's time unit, and means, per algorithm:
///
/// | algorithm | stamp |
/// |---|---|
/// | GCRA, leaky bucket | the end of the slot the charge took in the key's schedule (the TAT right after the charge, in the coordinates of the key's earlier stamps) |
/// | fixed window, sliding window counter | the index of the window the charge counted in |
/// | sliding log | the time of the log entry the charge added |
/// | concurrency | the time of the check (a permit is the same whenever it was taken; a store may use the time to tell lives of a key apart) |
///
/// **GCRA and the leaky bucket: the FIFO ledger.** A charge of `n` units takes a slot of
/// `n * T` at the end of the key's schedule; the bucket drains the schedule from the front,
/// one unit of time per unit of time. A refund, in any order, gives back exactly the part of
/// its own charge's slot not yet drained, and the slots after it move up: never time already
/// drained, never another charge's (as long as the refunds and give-backs of one receipt
/// total at most its charge's cost). The stores keep this with the key's state alone while
/// refunds take the latest charge (or a drained one); the first refund out of the middle of
/// the schedule moves the key to an explicit ledger of its live slots, kept until the ledger
/// is empty and every stamp the key handed out is stale. The bounds: a ledger keeps at most
/// 1,024 live spans (a schedule of at most 1,024 live charges never reaches it; past it, the
/// smallest hole between two spans is filled again, so the key may wait longer than its
/// exact schedule says, never less); while a Delay-mode reservation waits beyond the
/// tolerance, a refund of an earlier charge gives back nothing (moving the waiter's turn up
/// would hand it to a newcomer); and in the memory store, a refund out of the middle of the
/// shared overflow state's schedule (keys beyond `max_keys`) gives back nothing.
///
/// [`Receipt::NONE`] is the receipt of a denied charge (which took nothing) and of a charge
/// whose store did not say; refunding it gives back nothing.
///
/// Eight bytes: the stamp `u64::MAX` is reserved for [`Receipt::NONE`] (no store time or
/// window index reaches it), so [`Receipt::new`]`(u64::MAX)` is [`Receipt::NONE`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt(u64);

impl Receipt {
    /// Took nothing: a refund of it gives back nothing.
    pub const NONE: Receipt = Receipt(u64::MAX);

    /// A receipt with the store's stamp (see the table above).
    pub const fn new(stamp: u64) -> Self {
        Self(stamp)
    }

    /// The stamp, `None` for [`Receipt::NONE`].
    pub const fn stamp(self) -> Option<u64> {
        if self.0 == u64::MAX {
            None
        } else {
            Some(self.0)
        }
    }

    /// Whether the charge took something that a refund could give back.
    pub const fn is_some(self) -> bool {
        self.0 != u64::MAX
    }
}

impl Default for Receipt {
    fn default() -> Self {
        Self::NONE
    }
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Receipt").field(&self.stamp()).finish()
    }
}
