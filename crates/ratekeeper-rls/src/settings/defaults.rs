//! Defaults of settings that the server also offers as public constants.

/// The default of [`Settings::memory_max_keys`](crate::settings::Settings::memory_max_keys):
/// the most counters the memory store holds per limit. Past it, idle ones are evicted, and
/// new ones share one overflow counter while every counter held is live.
pub const MEMORY_MAX_KEYS: std::num::NonZeroUsize = match std::num::NonZeroUsize::new(1 << 20) {
    Some(n) => n,
    None => std::num::NonZeroUsize::MIN,
};
