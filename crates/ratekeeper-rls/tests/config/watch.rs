//! Hot reload: the three ways config files change in practice (written in place, a
//! Kubernetes ConfigMap's `..data` swap, a file renamed into the directory), a removal, and a
//! bad file that keeps the old config.
//!
//! Timing: the watcher polls every `INTERVAL`; a change is loaded at the second poll that
//! reads the same new files (the `watch` module's unit tests drive the poller step by step,
//! no clock involved), and every kind of change alters the fingerprint a poll compares
//! (`fingerprint_changes_with_each_kind_of_change`). The end-to-end tests wait up to `WAIT`
//! for the report, so a loaded machine does not fail them; the 2 s target follows from two
//! intervals (250 ms each by default), not from these waits.

use std::fs;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use ratekeeper_rls::config::watch::{self, Watcher};
use ratekeeper_rls::config::{ConfigError, ConfigErrorKind, LoadOptions, RateLimitConfig};

const INTERVAL: Duration = Duration::from_millis(50);
const WAIT: Duration = Duration::from_secs(10);

type Reload = Result<RateLimitConfig, ConfigError>;

fn config(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: second, requests_per_unit: 1}}\n"
    )
}

fn start(path: &Path) -> (Watcher, mpsc::Receiver<Reload>) {
    let (tx, rx) = mpsc::channel();
    let w = watch::try_watch(
        path.to_owned(),
        LoadOptions::default(),
        INTERVAL,
        move |r| {
            let _ = tx.send(r);
        },
    )
    .expect("watcher starts");
    (w, rx)
}

/// The next reload's domains (the reload must succeed).
fn next_domains(rx: &mpsc::Receiver<Reload>) -> Vec<String> {
    match rx.recv_timeout(WAIT) {
        Ok(Ok(c)) => c.domains().map(str::to_owned).collect(),
        Ok(Err(e)) => panic!("reload failed: {e}"),
        Err(e) => panic!("no reload within {WAIT:?}: {e}"),
    }
}

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

#[test]
fn file_written_in_place_reloads() {
    let dir = tempdir();
    fs::write(dir.path().join("a.yaml"), config("one")).unwrap();
    let (_w, rx) = start(dir.path());
    fs::write(dir.path().join("a.yaml"), config("two")).unwrap();
    assert_eq!(next_domains(&rx), ["two"]);
}

#[test]
fn a_single_file_path_reloads() {
    let dir = tempdir();
    let file = dir.path().join("only.yaml");
    fs::write(&file, config("one")).unwrap();
    let (_w, rx) = start(&file);
    fs::write(&file, config("two")).unwrap();
    assert_eq!(next_domains(&rx), ["two"]);
}

/// The layout the kubelet writes for a ConfigMap volume, and its atomic update.
fn configmap(dir: &Path, version: &str, domain: &str) {
    let data = dir.join(version);
    fs::create_dir(&data).unwrap();
    fs::write(data.join("rules.yaml"), config(domain)).unwrap();
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(version, &tmp).unwrap();
    fs::rename(&tmp, dir.join("..data")).unwrap();
    let link = dir.join("rules.yaml");
    if fs::symlink_metadata(&link).is_err() {
        std::os::unix::fs::symlink("..data/rules.yaml", &link).unwrap();
    }
}

#[test]
fn configmap_data_swap_reloads() {
    let dir = tempdir();
    configmap(dir.path(), "..2026_01_01_00_00_00.1", "one");
    let opts = LoadOptions::default().ignore_dotfiles(true);
    assert_eq!(
        RateLimitConfig::load_path(dir.path(), &opts)
            .unwrap()
            .domains()
            .collect::<Vec<_>>(),
        ["one"]
    );
    let (_w, rx) = start(dir.path());
    configmap(dir.path(), "..2026_01_01_00_01_00.2", "two");
    fs::remove_dir_all(dir.path().join("..2026_01_01_00_00_00.1")).unwrap();
    assert_eq!(next_domains(&rx), ["two"]);
}

/// The reference's default mode (`RUNTIME_WATCH_ROOT=true`): a new runtime tree, then the
/// root link `current` swapped to it.
#[test]
fn runtime_root_link_swap_reloads() {
    let dir = tempdir();
    let tree = |version: &str, domain: &str| {
        let config = dir.path().join(version).join("ratelimit/config");
        fs::create_dir_all(&config).unwrap();
        fs::write(config.join("a.yaml"), self::config(domain)).unwrap();
        let tmp = dir.path().join("current_tmp");
        std::os::unix::fs::symlink(version, &tmp).unwrap();
        fs::rename(&tmp, dir.path().join("current")).unwrap();
    };
    tree("v1", "one");
    let path = dir.path().join("current/ratelimit/config");
    let (_w, rx) = start(&path);
    tree("v2", "two");
    assert_eq!(next_domains(&rx), ["two"]);
}

#[test]
fn file_renamed_into_the_directory_reloads() {
    let dir = tempdir();
    fs::write(dir.path().join("a.yaml"), config("one")).unwrap();
    let (_w, rx) = start(dir.path());
    let tmp = dir.path().join(".b.yaml.tmp");
    fs::write(&tmp, config("two")).unwrap();
    fs::rename(&tmp, dir.path().join("b.yaml")).unwrap();
    // The temporary file is not a config file: the only reload is the rename's.
    assert_eq!(next_domains(&rx), ["one", "two"]);
}

#[test]
fn file_removed_reloads() {
    let dir = tempdir();
    fs::write(dir.path().join("a.yaml"), config("one")).unwrap();
    fs::write(dir.path().join("b.yaml"), config("two")).unwrap();
    let (_w, rx) = start(dir.path());
    fs::remove_file(dir.path().join("b.yaml")).unwrap();
    assert_eq!(next_domains(&rx), ["one"]);
}

#[test]
fn bad_file_reports_the_error_then_recovers() {
    let dir = tempdir();
    let file = dir.path().join("a.yaml");
    fs::write(&file, config("one")).unwrap();
    let (_w, rx) = start(dir.path());
    fs::write(
        &file,
        "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    match rx.recv_timeout(WAIT) {
        Ok(Err(e)) => {
            assert!(
                matches!(e.kind(), ConfigErrorKind::InvalidUnit { .. }),
                "{e}"
            );
            assert_eq!((e.line(), e.column()), (Some(4), Some(24)));
        }
        Ok(Ok(c)) => panic!("a bad file loaded: {c:?}"),
        Err(e) => panic!("no report within {WAIT:?}: {e}"),
    }
    fs::write(&file, config("fixed")).unwrap();
    assert_eq!(next_domains(&rx), ["fixed"]);
}

#[test]
fn dropping_the_watcher_stops_it() {
    let dir = tempdir();
    fs::write(dir.path().join("a.yaml"), config("one")).unwrap();
    let (tx, rx) = mpsc::channel::<Reload>();
    let w = watch::watch(
        dir.path().to_owned(),
        LoadOptions::default(),
        INTERVAL,
        move |r| {
            let _ = tx.send(r);
        },
    );
    assert!(w.error().is_none());
    drop(w);
    fs::write(dir.path().join("a.yaml"), config("two")).unwrap();
    // The callback (and its sender) went with the thread: nothing more can arrive.
    assert!(matches!(
        rx.recv_timeout(WAIT),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
}

#[test]
fn fingerprint_changes_with_each_kind_of_change() {
    let dir = tempdir();
    let opts = LoadOptions::default();
    configmap(dir.path(), "..v1", "one");
    let mut last = watch::fingerprint(dir.path(), &opts);
    let mut step = |what: &str, f: &dyn Fn()| {
        f();
        let now = watch::fingerprint(dir.path(), &opts);
        assert_ne!(now, last, "{what} is not seen");
        last = now;
    };
    step("a ConfigMap swap", &|| configmap(dir.path(), "..v2", "two"));
    step("a write in place", &|| {
        fs::write(dir.path().join("plain.yaml"), config("three")).unwrap()
    });
    step("a rewrite", &|| {
        fs::write(dir.path().join("plain.yaml"), config("four")).unwrap()
    });
    step("a rename into the directory", &|| {
        fs::write(dir.path().join(".tmp"), config("five")).unwrap();
        fs::rename(dir.path().join(".tmp"), dir.path().join("z.yml")).unwrap();
    });
    step("a removal", &|| {
        fs::remove_file(dir.path().join("z.yml")).unwrap()
    });
    // Same bytes again: no change.
    fs::write(dir.path().join("plain.yaml"), config("four")).unwrap();
    assert_eq!(watch::fingerprint(dir.path(), &opts), last);
}
