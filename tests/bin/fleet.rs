//! The fleet harness (see `ratekeeper_tests::fleet`): prints a markdown table, one row per
//! run, each against a fresh `redis-server` (or Cluster) on loopback.
//!
//! ```text
//! fleet table                 # N = 2, 4, 8 x every fault x allow, deny, fail-soft
//! fleet one N POLICY FAULT [LIMIT BURST OFFERED SECS]
//!       POLICY: allow | deny | fail-soft | local
//!       FAULT:  none | kill-instance | pause | restart | kill-primary (a Cluster)
//! fleet flood                 # 8 instances offering 12 000 checks/s against 1 000/s, allow
//! ```

use std::time::Duration;

use ratekeeper_core::store::FailurePolicy;
use ratekeeper_tests::fleet::{Fault, Report, Scenario, run};

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
        _ => return None,
    })
}

fn usage() -> ! {
    eprintln!(
        "usage: fleet table | fleet flood | fleet one N POLICY FAULT [LIMIT BURST OFFERED SECS]"
    );
    std::process::exit(2);
}

/// The runs of `fleet table`.
fn table() -> Vec<Scenario> {
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
                    duration: Duration::from_secs(secs),
                    seed: 1 + n as u64,
                    ..Scenario::default()
                });
            }
        }
    }
    runs
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs = match args.first().map(String::as_str) {
        Some("table") => table(),
        Some("flood") => vec![Scenario {
            instances: 8,
            on_failure: FailurePolicy::Allow,
            limit: 1_000,
            burst: 1_000,
            offered: 12.0,
            duration: Duration::from_secs(5),
            ..Scenario::default()
        }],
        Some("one") => {
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
    println!("{}", Report::header());
    for scenario in runs {
        let report = runtime.block_on(run(scenario));
        println!("{}", report.row());
        if std::env::var_os("FLEET_TRACE").is_some() {
            // The degraded decisions' times, ms from the start of the load.
            let times: Vec<String> = report
                .events
                .iter()
                .filter(|e| e.outcome.is_degraded())
                .map(|e| e.at.as_millis().to_string())
                .collect();
            eprintln!("degraded at: {}", times.join(" "));
        }
    }
}
