//! The flood row of the fleet harness: `flood <redis url> [instances] [checks/s each]
//! [seconds]` (defaults 8, 1 500, 5) floods one key through that many Redis store handles
//! against GCRA 1 000/s, burst 100, and prints what was admitted (see
//! `ratekeeper_tests::flood`). Exits 1 when a 1 s window admitted more than 1.1 × 1 000.

use std::time::Duration;

use ratekeeper_tests::flood::{FloodConfig, flood};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(url) = args.first() else {
        eprintln!("usage: flood <redis url> [instances] [checks/s each] [seconds]");
        std::process::exit(2);
    };
    let number = |i: usize, default: u64| {
        args.get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(default)
    };
    let config = FloodConfig {
        instances: usize::try_from(number(1, 8)).unwrap_or(8),
        rate: u32::try_from(number(2, 1_500)).unwrap_or(1_500),
        duration: Duration::from_secs(number(3, 5)),
        ..FloodConfig::default()
    };
    let prefix = format!("flood{}", std::process::id());
    let report = flood(url, &prefix, &config).await;
    let (redis, cached, degraded) = report.total();
    println!(
        "offered {} admitted {} worst-1s-window {} per-second {:?} redis-decisions {redis} \
         negative-cache-hits {cached} degraded {degraded} latency p50/p99/max {:?}",
        report.offered, report.admitted, report.worst_window, report.per_second, report.latency
    );
    if report.worst_window > 1_100 {
        std::process::exit(1);
    }
}
