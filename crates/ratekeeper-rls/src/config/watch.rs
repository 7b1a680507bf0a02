//! Hot reload: watch the config path and load it again when its files change.
//!
//! The watcher polls: every `interval` it reads the config files (following symbolic links)
//! and compares a fingerprint of their names and contents with the last one. This catches the
//! three ways config files change in practice, without platform file-event APIs:
//!
//! - a file written in place (`vi`, `cp`, `kubectl cp`);
//! - a Kubernetes ConfigMap update: the files are links `x.yaml -> ..data/x.yaml`, and the
//!   kubelet renames a new `..data_tmp` link over `..data`;
//! - a new file renamed into the directory (the atomic-write idiom), or a file removed.
//!
//! A change is reported within `interval` plus the time to read the files; with the default
//! [`DEFAULT_INTERVAL`] of 250 ms that is well under 2 s. A change that leaves the files as
//! they were (a rewrite with the same bytes) is not reported. A config that fails to load is
//! reported once as an error; the caller keeps the config it has (the reference does the
//! same and counts `config_load_error`).
//!
//! ```no_run
//! use std::path::PathBuf;
//! use std::sync::{Arc, Mutex};
//! use ratekeeper_rls::config::{LoadOptions, RateLimitConfig, watch};
//!
//! let path = PathBuf::from("/data/ratelimit/config");
//! let opts = LoadOptions::default();
//! // Start watching first, then load: a change in between is then reported, not lost.
//! let current = Arc::new(Mutex::new(RateLimitConfig::default()));
//! let slot = Arc::clone(&current);
//! let _watcher = watch::watch(path.clone(), opts.clone(), watch::DEFAULT_INTERVAL, move |result| {
//!     match result {
//!         Ok(config) => *slot.lock().unwrap() = config,
//!         Err(e) => eprintln!("config not reloaded: {e}"),
//!     }
//! });
//! *current.lock().unwrap() = RateLimitConfig::load_path(&path, &opts).unwrap();
//! ```

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::{ConfigError, LoadOptions, RateLimitConfig, load};

/// The default polling interval: 250 ms.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(250);

/// A running watcher; dropping it stops the watch (and joins its thread).
#[derive(Debug)]
pub struct Watcher {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Stops watching and waits for the polling thread to end (at most one poll).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The files under a config path, read once: what a poll compares and loads.
type Snapshot = Result<load::Files, ConfigError>;

fn hash_snapshot(snapshot: &Snapshot) -> u64 {
    let mut h = DefaultHasher::new();
    match snapshot {
        Ok((files, warnings)) => {
            0u8.hash(&mut h);
            files.hash(&mut h);
            for w in warnings {
                w.file.hash(&mut h);
            }
        }
        Err(e) => {
            1u8.hash(&mut h);
            e.to_string().hash(&mut h);
        }
    }
    h.finish()
}

/// A fingerprint of the config files under `path`: their names and contents (or the read
/// error). Equal fingerprints mean a load would give the same result.
pub fn fingerprint(path: &Path, opts: &LoadOptions) -> u64 {
    hash_snapshot(&load::read_path(path, opts))
}

/// Polls `path` every `interval` and calls `on_reload` with the new config (or why it does
/// not load) each time the files change. The first fingerprint is taken before this returns,
/// so load the initial config after calling it.
///
/// Runs on its own thread (no async runtime needed); `on_reload` runs on that thread.
pub fn watch<F>(path: PathBuf, opts: LoadOptions, interval: Duration, mut on_reload: F) -> Watcher
where
    F: FnMut(Result<RateLimitConfig, ConfigError>) + Send + 'static,
{
    let mut poller = Poller::new(fingerprint(&path, &opts));
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = thread::Builder::new()
        .name("rls-config-watch".to_owned())
        .spawn(move || {
            loop {
                match stopped.recv_timeout(interval) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
                if let Some(result) = poller.poll(&path, &opts) {
                    on_reload(result);
                }
            }
        })
        .ok();
    Watcher {
        stop: Some(stop),
        thread,
    }
}

/// One poll step, apart from the timing (tests drive it without sleeping).
#[derive(Debug)]
pub(crate) struct Poller {
    last: u64,
}

impl Poller {
    pub(crate) fn new(last: u64) -> Self {
        Poller { last }
    }

    /// `Some` when the files changed since the last poll: the load of what was read.
    pub(crate) fn poll(
        &mut self,
        path: &Path,
        opts: &LoadOptions,
    ) -> Option<Result<RateLimitConfig, ConfigError>> {
        let snapshot = load::read_path(path, opts);
        let now = hash_snapshot(&snapshot);
        if now == self.last {
            return None;
        }
        self.last = now;
        Some(snapshot.and_then(|(files, warnings)| {
            load::build(
                files.iter().map(|(n, t)| (n.as_str(), t.as_str())),
                opts,
                warnings,
            )
            .map_err(|mut errors| errors.swap_remove(0))
        }))
    }
}
