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
//! A change is loaded when two polls in a row read the same new files, so a file caught half
//! written is never loaded: it is reported within two intervals plus the time to read the
//! files, with the default [`DEFAULT_INTERVAL`] of 250 ms about half a second, well under the
//! 2 s a rollout expects. A change that leaves the files as they were (a rewrite with the same
//! bytes) is not reported.
//!
//! Both of the reference's modes are covered: `RUNTIME_WATCH_ROOT=true` (a symbolic link
//! swap of the runtime root: the paths are read through the links, so the new target's files
//! are what the next poll reads) and `RUNTIME_WATCH_ROOT=false` (changes inside the
//! directory). A config that fails to load is
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
//! *current.lock().unwrap() = RateLimitConfig::load_path(&path, &opts)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
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
    error: Option<std::io::Error>,
}

impl Watcher {
    /// Why the watcher is not running, when [`watch`] could not start its thread.
    pub fn error(&self) -> Option<&std::io::Error> {
        self.error.as_ref()
    }

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
/// Runs on its own thread (no async runtime needed); `on_reload` runs on that thread. If the
/// operating system cannot start the thread, the error is logged (`tracing`, level error) and
/// kept in [`Watcher::error`], and nothing is watched; [`try_watch`] returns it instead.
pub fn watch<F>(path: PathBuf, opts: LoadOptions, interval: Duration, on_reload: F) -> Watcher
where
    F: FnMut(Result<RateLimitConfig, ConfigError>) + Send + 'static,
{
    match try_watch(path, opts, interval, on_reload) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "config watcher not started: reloads are off");
            Watcher {
                stop: None,
                thread: None,
                error: Some(e),
            }
        }
    }
}

/// As [`watch`], with the thread's start-up error returned.
///
/// # Errors
///
/// The polling thread could not be started.
pub fn try_watch<F>(
    path: PathBuf,
    opts: LoadOptions,
    interval: Duration,
    mut on_reload: F,
) -> std::io::Result<Watcher>
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
        })?;
    Ok(Watcher {
        stop: Some(stop),
        thread: Some(thread),
        error: None,
    })
}

/// One poll step, apart from the timing (tests drive it without sleeping).
///
/// A change is loaded once two polls in a row read the same new files: a file caught half
/// written (an editor's save, a slow copy) is not loaded, and not reported as an error.
#[derive(Debug)]
pub(crate) struct Poller {
    /// The fingerprint of the files last loaded (or of the files at start).
    last: u64,
    /// A new fingerprint seen once, waiting for a second poll to confirm it.
    pending: Option<u64>,
}

impl Poller {
    pub(crate) fn new(last: u64) -> Self {
        Poller {
            last,
            pending: None,
        }
    }

    /// `Some` when the files changed and then held still for one interval: the load of what
    /// was read.
    pub(crate) fn poll(
        &mut self,
        path: &Path,
        opts: &LoadOptions,
    ) -> Option<Result<RateLimitConfig, ConfigError>> {
        let snapshot = load::read_path(path, opts);
        let now = hash_snapshot(&snapshot);
        if now == self.last {
            self.pending = None;
            return None;
        }
        if self.pending != Some(now) {
            self.pending = Some(now);
            return None;
        }
        self.last = now;
        self.pending = None;
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

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    const GOOD: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

    fn domains(result: Option<Result<RateLimitConfig, ConfigError>>) -> Vec<String> {
        match result {
            Some(Ok(c)) => c.domains().map(str::to_owned).collect(),
            Some(Err(e)) => panic!("load failed: {e}"),
            None => panic!("no reload"),
        }
    }

    #[test]
    fn a_change_loads_at_the_second_poll_that_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        fs::write(&file, GOOD).unwrap();
        let opts = LoadOptions::default();
        let mut p = Poller::new(fingerprint(dir.path(), &opts));
        assert!(p.poll(dir.path(), &opts).is_none(), "nothing changed");
        fs::write(&file, GOOD.replace("domain: d", "domain: e")).unwrap();
        assert!(p.poll(dir.path(), &opts).is_none(), "first sight: wait");
        assert_eq!(domains(p.poll(dir.path(), &opts)), ["e"]);
        assert!(p.poll(dir.path(), &opts).is_none(), "loaded once");
    }

    #[test]
    fn a_half_written_file_is_not_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        fs::write(&file, GOOD).unwrap();
        let opts = LoadOptions::default();
        let mut p = Poller::new(fingerprint(dir.path(), &opts));
        let new = GOOD.replace("domain: d", "domain: e");
        // A poll lands mid-write (the text cut in the flow map: a syntax error) ...
        fs::write(&file, &new[..new.len() - 10]).unwrap();
        assert!(p.poll(dir.path(), &opts).is_none());
        // ... the write completes before the next poll: only the whole file is loaded.
        fs::write(&file, &new).unwrap();
        assert!(p.poll(dir.path(), &opts).is_none());
        assert_eq!(domains(p.poll(dir.path(), &opts)), ["e"]);
    }

    #[test]
    fn a_change_undone_before_confirmation_is_not_reported() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.yaml");
        fs::write(&file, GOOD).unwrap();
        let opts = LoadOptions::default();
        let mut p = Poller::new(fingerprint(dir.path(), &opts));
        fs::write(&file, "garbage: [").unwrap();
        assert!(p.poll(dir.path(), &opts).is_none());
        fs::write(&file, GOOD).unwrap();
        assert!(p.poll(dir.path(), &opts).is_none());
        assert!(p.poll(dir.path(), &opts).is_none());
    }
}
