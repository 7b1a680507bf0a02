//! The Redis Cluster and tiered stores, chosen by the settings, count as the others do.

use crate::support::*;

async fn counts_down_then_refuses(b: Backend) {
    let yaml = "domain: st\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let mut rls = Rls::start(b, yaml, &[]).await;
    for i in 0..7u32 {
        let r = rls
            .call(req("st", vec![desc(&[("k", "a")]), desc(&[("k", "b")])], 0))
            .await;
        let want = if i < 5 { (ok(), 4 - i) } else { (over(), 0) };
        assert_eq!(cr(&r.statuses[0]), want, "hit {}", i + 1);
        assert_eq!(cr(&r.statuses[1]), want, "hit {}", i + 1);
        assert_eq!(r.statuses[0].duration_until_reset.unwrap().seconds, 30);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_counts_down_then_refuses() {
    counts_down_then_refuses(Backend::Cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_store_counts_down_then_refuses() {
    counts_down_then_refuses(Backend::Tiered).await;
}
