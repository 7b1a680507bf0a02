//! Captured logs: a `tracing_subscriber` writer that keeps everything a subscriber writes in
//! memory, for tests that read what the layer and the stores log.
//!
//! ```text
//! let logs = Captured::default();
//! let subscriber = tracing_subscriber::fmt().with_writer(logs.clone()).with_ansi(false).finish();
//! let _guard = tracing::subscriber::set_default(subscriber);
//! // ... requests ...
//! assert_eq!(logs.lines("WARN").len(), 1, "{}", logs.text());
//! ```

use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tracing_subscriber::fmt::MakeWriter;

/// Everything a log subscriber wrote (one event per line with the `fmt` subscriber). Clones
/// share one buffer: give the subscriber a clone and read the original.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The whole log so far (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buffer()).into_owned()
    }

    /// The lines whose first word is `level` (`"INFO"`, `"WARN"`, ...): the events at that
    /// level, for a subscriber without timestamps (`without_time`).
    pub fn lines(&self, level: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(level))
            .map(str::to_owned)
            .collect()
    }

    /// The buffer; a writer that panicked while holding it left whole writes in it, so it
    /// is read as is.
    fn buffer(&self) -> MutexGuard<'_, Vec<u8>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.buffer().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self {
        self.clone()
    }
}
