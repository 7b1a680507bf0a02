//! Redis's scripting contract on a real `redis-server`: every key the limiter script reads
//! or writes is declared in the call's `KEYS` (of its `FCALL`, or `EVALSHA` on Redis 6), in
//! every mode (check, reserve, peek and inspect, refund, correction, reset), states, reset
//! fences and ban keys alike. `MONITOR` shows each
//! command a script runs (`[0 lua] "GET" "<key>"`) right after the call that ran it, so
//! every key a script command names is checked against the keys that call declared.

use std::io::{BufRead, BufReader};
use std::num::NonZeroU32;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ratekeeper_axum::core::Ban;
use ratekeeper_axum::core::clock::ManualClock;
use ratekeeper_axum::core::store::Store;
use ratekeeper_axum::core::store::redis::RedisStore;
use ratekeeper_axum::{core::Algorithm, core::Key, core::Policy, core::Quota};
use ratekeeper_tests::redis::{DECISION_DEADLINE, RedisServer};

const MS: u64 = 1_000_000;

/// A `redis-cli monitor` of `server`, its lines read on a thread of their own.
struct Monitor {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Monitor {
    /// Starts the monitor and waits until it sees a command sent after it.
    fn start(server: &RedisServer) -> Self {
        let mut child = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &server.port().to_string(),
                "monitor",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli monitor starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let monitor = Self { child, lines };
        monitor.until(server, "monitor-ready");
        monitor
    }

    /// Sends `ECHO <marker>` until the monitor shows it (within 10 s); the lines before it.
    fn until(&self, server: &RedisServer, marker: &str) -> Vec<String> {
        let started = Instant::now();
        let mut seen = Vec::new();
        while started.elapsed() < Duration::from_secs(10) {
            server.cli(&["ECHO", marker]);
            while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                if line.contains(marker) {
                    return seen;
                }
                seen.push(line);
            }
        }
        panic!("the monitor never showed {marker}");
    }

    /// The lines up to now, and the monitor stopped.
    fn stop(mut self, server: &RedisServer) -> Vec<String> {
        let lines = self.until(server, "monitor-end");
        let _ = self.child.kill();
        let _ = self.child.wait();
        lines
    }
}

/// A `MONITOR` line, `<time> [<db> <source>] "arg" "arg" ...`: its source (`lua` for a
/// script's command) and its arguments, unquoted.
fn parse(line: &str) -> Option<(String, Vec<String>)> {
    let open = line.find('[')?;
    let close = line[open..].find(']')? + open;
    let source = line[open + 1..close].split(' ').nth(1)?.to_owned();
    let mut args = Vec::new();
    let mut chars = line[close + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => {
                    if let Some(escaped) = chars.next() {
                        arg.push(escaped);
                    }
                }
                other => arg.push(other),
            }
        }
        args.push(arg);
    }
    Some((source, args))
}

/// Every key a script command names in `lines`, with the keys its call declared; panics
/// on a command outside any call.
fn touched(lines: &[String]) -> Vec<(String, Vec<String>)> {
    let mut declared: Option<Vec<String>> = None;
    let mut out = Vec::new();
    for line in lines {
        let Some((source, args)) = parse(line) else {
            continue;
        };
        let Some(command) = args.first().map(|c| c.to_ascii_uppercase()) else {
            continue;
        };
        if source == "lua" {
            let keys = declared
                .clone()
                .unwrap_or_else(|| panic!("a script command outside a call: {line}"));
            // TIME is the only command the script runs that names no key; every other one
            // (GET, SET, DEL, PTTL, PEXPIRE, the sorted-set commands) names its key first.
            if command != "TIME" {
                out.push((args[1].clone(), keys));
            }
        } else if command == "FCALL" || command == "EVALSHA" || command == "EVAL" {
            let n: usize = args[2].parse().expect("key count");
            declared = Some(args[3..3 + n].to_vec());
        } else {
            declared = None;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_the_limiter_script_touches_is_declared() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(1_000_000 * MS);
    let mut store = RedisStore::builder()
        .clock(clock.clone())
        .deadline(DECISION_DEADLINE)
        .min_ttl(Duration::from_secs(3_600))
        .negative_cache(false)
        .standalone(&server.url())
        .await
        .expect("standalone");
    let quota = |limit| Quota::new(limit, Duration::from_secs(10)).expect("valid quota");
    let ban = Ban::after(NonZeroU32::MIN, Duration::from_secs(60)).lasting(Duration::from_secs(60));
    let ids = [
        store.register(&Policy::new("gcra", quota(2)).with_ban(ban)),
        store.register(&Policy::new("fw", quota(2)).with_algorithm(Algorithm::FixedWindow)),
        store.register(&Policy::new("sw", quota(2)).with_algorithm(Algorithm::SlidingWindow)),
        store.register(&Policy::new("log", quota(2)).with_algorithm(Algorithm::SlidingLog)),
    ]
    .map(|id| id.expect("register"));
    let key = Key::from("client");
    let all: Vec<_> = ids.iter().map(|&id| (id, key.clone(), 1)).collect();

    let monitor = Monitor::start(&server);
    let first = store.check_async(&all).await.expect("check");
    assert!(first.is_allowed(), "{first:?}");
    let second = store
        .reserve_async(&all, Duration::from_secs(1))
        .await
        .expect("reserve");
    // Refused (the windows and the log are full): the ban starts.
    let third = store.check_async(&all).await.expect("check");
    assert!(!third.is_allowed(), "{third:?}");
    store.peek_async(ids[1], &key).await.expect("peek");
    let refunds: Vec<_> = all
        .iter()
        .cloned()
        .zip(first.receipts())
        .collect::<Vec<_>>();
    store.refund_async(&refunds).await.expect("refund");
    let corrections: Vec<_> = all
        .iter()
        .cloned()
        .zip(second.receipts())
        .enumerate()
        // A give-back on the first two policies, an extra charge on the others.
        .map(|(i, (charge, receipt))| (charge, receipt, if i < 2 { 0 } else { 3 }))
        .collect();
    store.correct_async(&corrections).await.expect("correct");
    store.reset_async(None, &key).await.expect("reset");
    let lines = monitor.stop(&server);

    let touched = touched(&lines);
    for (name, declared) in &touched {
        assert!(
            declared.contains(name),
            "the script touched {name}, not declared in {declared:?}"
        );
    }
    // What was checked: the states, the ban key and the reset fences (read by the refund
    // and the correction, written by the reset).
    let names: Vec<&str> = touched.iter().map(|(n, _)| n.as_str()).collect();
    for policy in ["gcra", "fw", "sw", "log"] {
        let state = format!("rl:v2:{{s:client}}:{policy}");
        let fence = format!("{state}#reset");
        assert!(names.contains(&state.as_str()), "{state} in {names:?}");
        assert!(
            names.iter().filter(|n| **n == fence).count() >= 3,
            "{fence} in {names:?}"
        );
    }
    assert!(names.contains(&"rl:v2:{s:client}:ban:gcra"), "{names:?}");
}

#[test]
fn a_monitor_line_reads_as_its_source_and_arguments() {
    let (source, args) =
        parse(r#"1796161731.923252 [0 lua] "GET" "rl:v2:{s:a\"b}:p#reset""#).expect("parses");
    assert_eq!(source, "lua");
    assert_eq!(args, ["GET", r#"rl:v2:{s:a"b}:p#reset"#]);
    let (source, args) =
        parse(r#"1.5 [0 127.0.0.1:44910] "EVALSHA" "abc" "1" "k""#).expect("parses");
    assert_eq!(source, "127.0.0.1:44910");
    assert_eq!(args, ["EVALSHA", "abc", "1", "k"]);
}
