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
/// | GCRA, leaky bucket | the TAT right after this charge (the end of the slot it took) |
/// | fixed window, sliding window counter | the index of the window the charge counted in |
/// | sliding log | the time of the log entry the charge added |
/// | concurrency | the time of the check (a permit is the same whenever it was taken; a store may use the time to tell lives of a key apart) |
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
