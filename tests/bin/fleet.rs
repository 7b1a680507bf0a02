//! The fleet harness (see `ratekeeper_tests::fleet`): prints a markdown table, one row per
//! run, each against a fresh `redis-server` (or Cluster) on loopback.
//!
//! ```text
//! fleet table                 # Redis store: N = 2, 4, 8 x every fault x allow, deny, fail-soft
//! fleet tiered                # the same on the tiered store (no Cluster fault)
//! fleet reset                 # an operator reset under load, N = 2, 4, 8, both stores
//! fleet one N POLICY FAULT [LIMIT BURST OFFERED SECS]
//! fleet one-tiered N POLICY FAULT [LIMIT BURST OFFERED SECS]
//!       POLICY: allow | deny | fail-soft | local
//!       FAULT:  none | kill-instance | pause | restart | kill-primary (a Cluster) | reset
//! fleet flood                 # 8 instances offering 12 000 checks/s against 1 000/s, allow
//! ```

use std::time::Duration;

use ratekeeper_core::store::FailurePolicy;
use ratekeeper_tests::fleet::{Fault, Outcome, Report, Scenario, run};

fn policy(name: &str) -> Option<FailurePolicy> {
    Some(match name {
        "allow" => FailurePolicy::Allow,
        "deny" => FailurePolicy::Deny,
        "fail-soft" => FailurePolicy::FailSoft,
        "local" => FailurePolicy::Local,
        _ => return None,
    })
}

fn fault(name: &str) -> Option<(Fault, bool)> {
    Some(match name {
        "none" => (Fault::None, false),
        "kill-instance" => (Fault::KillInstance, false),
        "pause" => (Fault::Pause(Duration::from_millis(200)), false),
        "restart" => (Fault::Restart, false),
        "kill-primary" => (Fault::KillPrimary, true),
        "reset" => (Fault::Reset, false),
        _ => return None,
    })
}

fn usage() -> ! {
    eprintln!(
        "usage: fleet table | fleet tiered | fleet reset | fleet flood \
         | fleet one[-tiered] N POLICY FAULT [LIMIT BURST OFFERED SECS]"
    );
    std::process::exit(2);
}

/// The runs of `fleet table` (the Redis store) and `fleet tiered` (the tiered store, on a
/// standalone server only).
fn table(tiered: bool) -> Vec<Scenario> {
    let mut runs = Vec::new();
    for (fault_name, secs) in [
        ("none", 4),
        ("kill-instance", 5),
        ("pause", 5),
        ("restart", 5),
        ("kill-primary", 8),
    ] {
        let Some((fault, cluster)) = fault(fault_name) else {
            continue;
        };
        if tiered && cluster {
            continue;
        }
        for n in [2, 4, 8] {
            for p in ["allow", "deny", "fail-soft"] {
                let Some(on_failure) = policy(p) else {
                    continue;
                };
                runs.push(Scenario {
                    instances: n,
                    on_failure,
                    fault,
                    cluster,
                    tiered,
                    duration: Duration::from_secs(secs),
                    seed: 1 + n as u64,
                    ..Scenario::default()
                });
            }
        }
    }
    runs
}

/// The runs of `fleet reset`: 500/s, burst 500, one key; 0.8 × the quota for 2 s (under
/// it, so tiered instances lease ahead), then an operator's reset through the first
/// instance and 3 × the quota for 2 s (over it: units leased before the reset and still
/// spent after it would show as admissions beyond the fresh bucket).
fn resets() -> Vec<Scenario> {
    let mut runs = Vec::new();
    for tiered in [false, true] {
        for n in [2, 4, 8] {
            runs.push(Scenario {
                instances: n,
                on_failure: FailurePolicy::Allow,
                fault: Fault::Reset,
                tiered,
                limit: 500,
                burst: 500,
                offered_before: Some(0.8),
                offered: 3.0,
                // Long enough that a loaded machine does not turn decisions into the failure
                // policy's: what this run measures is what Redis and the leases admit.
                deadline: Duration::from_millis(250),
                duration: Duration::from_secs(4),
                seed: 1 + n as u64,
                ..Scenario::default()
            });
        }
    }
    runs
}

/// The 1 min load average (`/proc/loadavg`), or `?` where there is none.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

fn main() {
    // `RUST_LOG=ratekeeper_core=debug fleet ...`: the stores' log lines on stderr.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs = match args.first().map(String::as_str) {
        Some("table") => table(false),
        Some("tiered") => table(true),
        Some("reset") => resets(),
        Some("flood") => vec![Scenario {
            instances: 8,
            on_failure: FailurePolicy::Allow,
            limit: 1_000,
            burst: 1_000,
            offered: 12.0,
            duration: Duration::from_secs(5),
            ..Scenario::default()
        }],
        Some(one @ ("one" | "one-tiered")) => {
            let get = |i: usize| args.get(i).map(String::as_str);
            let (Some(n), Some(p), Some(f)) = (
                get(1).and_then(|s| s.parse().ok()),
                get(2).and_then(policy),
                get(3).and_then(fault),
            ) else {
                usage()
            };
            let num = |i: usize, d: f64| get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
            vec![Scenario {
                instances: n,
                on_failure: p,
                fault: f.0,
                cluster: f.1,
                tiered: one == "one-tiered",
                limit: num(4, 200.0) as u32,
                burst: num(5, 200.0) as u32,
                offered: num(6, 2.0),
                duration: Duration::from_secs_f64(num(7, 5.0)),
                ..Scenario::default()
            }]
        }
        _ => usage(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    // A reset run has a table of its own (every run of one command is of one kind).
    let reset_rows = runs.first().is_some_and(|s| s.fault == Fault::Reset);
    let header = if reset_rows {
        Report::reset_header()
    } else {
        Report::header()
    };
    // One more column: the machine's load average (1 min) when the row ends.
    let mut lines = header.lines();
    println!("{} load |", lines.next().unwrap_or_default());
    println!("{}---|", lines.next().unwrap_or_default());
    for scenario in runs {
        let report = runtime.block_on(run(scenario));
        let row = if reset_rows {
            report.reset_row()
        } else {
            report.row()
        };
        println!("{row} {} |", load_average());
        if std::env::var_os("FLEET_TRACE").is_some() {
            // The degraded decisions' times, ms from the start of the load.
            let times: Vec<String> = report
                .events
                .iter()
                .filter(|e| e.outcome.is_degraded())
                .map(|e| e.at.as_millis().to_string())
                .collect();
            eprintln!("degraded at: {}", times.join(" "));
            // Per 100 ms from the start of the load: admitted by Redis (or a lease), denied by
            // Redis, admitted by the failure policy, denied by it (429), 503.
            let slots = report
                .events
                .last()
                .map_or(0, |e| e.at.as_millis() / 100 + 1);
            let mut counts = vec![[0u32; 5]; usize::try_from(slots).unwrap_or(0)];
            for e in &report.events {
                let slot = usize::try_from(e.at.as_millis() / 100).unwrap_or(usize::MAX);
                let column = match e.outcome {
                    Outcome::Admitted => 0,
                    Outcome::Denied => 1,
                    Outcome::DegradedAdmitted => 2,
                    Outcome::DegradedDenied => 3,
                    Outcome::Unavailable => 4,
                };
                if let Some(c) = counts.get_mut(slot) {
                    c[column] += 1;
                }
            }
            eprintln!("ms: admitted denied degraded-admitted degraded-denied 503");
            for (i, c) in counts.iter().enumerate() {
                eprintln!("{:>5}: {:?}", i * 100, c);
            }
        }
    }
}
