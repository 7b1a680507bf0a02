//! How error messages write a duration (used by [`crate::throttle`] and the stores' errors).

use std::time::Duration;

/// A duration as error messages write it: seconds with up to 3 decimals (`"120 s"`,
/// `"1.5 s"`, `"0.001 s"`), never `Duration`'s `Debug` form.
///
/// ```
/// use std::time::Duration;
/// use ratekeeper_core::throttle::seconds;
///
/// assert_eq!(seconds(Duration::from_secs(120)), "120 s");
/// assert_eq!(seconds(Duration::from_millis(1500)), "1.5 s");
/// assert_eq!(seconds(Duration::from_micros(250)), "0 s");
/// ```
pub fn seconds(d: Duration) -> String {
    let ms = d.as_millis();
    let (whole, frac) = (ms / 1000, ms % 1000);
    if frac == 0 {
        format!("{whole} s")
    } else {
        let frac = format!("{frac:03}");
        format!("{whole}.{} s", frac.trim_end_matches('0'))
    }
}
