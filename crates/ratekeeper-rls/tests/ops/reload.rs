//! Hot reload: a good config swaps in, a bad one keeps the one in force; both counted.

use std::time::{Duration, Instant};

use crate::support::*;

fn config(limit: u32) -> String {
    format!(
        "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {limit}}}\n"
    )
}

async fn limit_of(rls: &mut Rls) -> u32 {
    let r = rls.call(req("reload", vec![desc(&[("k", "v")])], 0)).await;
    r.statuses[0]
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_config_swaps_in_and_a_bad_one_keeps_the_old() {
    let mut rls = Rls::start(Backend::Memory, &config(5), &[]).await;
    assert_eq!(limit_of(&mut rls).await, 5);
    let metrics = |rls: &Rls| {
        let addr = rls.server().local_debug_addr();
        async move { get(&format!("http://{addr}/metrics")).await.1 }
    };
    let m = metrics(&rls).await;
    let (ok0, err0) = (
        sample(&m, "ratelimit_service_config_load_success", ""),
        sample(&m, "ratelimit_service_config_load_error", ""),
    );
    let path = rls.dir.path().join("config.yaml");

    std::fs::write(&path, config(7)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while limit_of(&mut rls).await != 7 {
        assert!(Instant::now() < deadline, "the new config never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let m = metrics(&rls).await;
    assert!(sample(&m, "ratelimit_service_config_load_success", "") >= ok0 + 1.0);

    std::fs::write(
        &path,
        "domain: reload\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sample(
        &metrics(&rls).await,
        "ratelimit_service_config_load_error",
        "",
    ) < err0 + 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the bad config was never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limit_of(&mut rls).await, 7, "the config in force stays");
    assert_eq!(rls.http_get("/healthcheck").await.0, 200);
}

/// Divergence (`compat`, row R6): a rule whose `requests_per_unit` or `unit` changes counts
/// from zero under the new limit (each (limit, unit) is its own store policy); the
/// reference's counter key has no limit in it, so its count carries over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_a_limit_starts_its_counter_afresh() {
    let mut rls = Rls::start(Backend::Memory, &config(5), &[]).await;
    for _ in 0..3 {
        rls.call(req("reload", vec![desc(&[("k", "fresh")])], 0))
            .await;
    }
    std::fs::write(rls.dir.path().join("config.yaml"), config(9)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = rls
            .call(req("reload", vec![desc(&[("k", "fresh")])], 0))
            .await;
        if r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
            == Some(9)
        {
            break r;
        }
        assert!(Instant::now() < deadline, "the new config never loaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(r.statuses[0].limit_remaining, 8);
}
