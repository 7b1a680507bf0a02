//! `MEMORY_MAX_KEYS`: the memory store's counters per limit are bounded; past the bound new
//! counters share one overflow counter under the same limit (never unlimited), and each
//! decision on it is counted.

use crate::support::*;

const CONFIG: &str = "\
domain: mem
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_past_max_keys_share_one_overflow_counter() {
    let mut rls = Rls::start(Backend::Memory, CONFIG, &[("MEMORY_MAX_KEYS", "2")]).await;
    let name = "ratekeeper_memory_store_overflowed_total";
    let label = "policy=\"rls_1_per_60s\"";
    let before = sample(&rls.debug_get("/metrics").await.1, name, label);
    let mut call = async |user: &str| {
        rls.call(req("mem", vec![desc(&[("user", user)])], 1))
            .await
            .overall_code
    };
    // Two counters of their own: one hit each.
    assert_eq!(call("a").await, ok());
    assert_eq!(call("b").await, ok());
    assert_eq!(call("a").await, over());
    // Past the bound: c and d share one counter of the same limit, 1 per minute.
    assert_eq!(call("c").await, ok());
    assert_eq!(call("d").await, over(), "d shares c's overflow counter");
    assert_eq!(call("e").await, over());
    // The counters held keep theirs.
    assert_eq!(call("b").await, over());
    let after = sample(&rls.debug_get("/metrics").await.1, name, label);
    assert!(after >= before + 3.0, "overflowed {before} -> {after}");
}

#[test]
fn max_keys_setting() {
    use ratekeeper_rls::settings::Settings;
    let parse = |args: Vec<&str>, var: Option<&'static str>| {
        Settings::parse(args, move |name: &str| {
            (name == "MEMORY_MAX_KEYS")
                .then(|| var.map(str::to_owned))
                .flatten()
        })
    };
    assert_eq!(
        parse(vec!["rls"], None).unwrap().0.memory_max_keys.get(),
        1 << 20
    );
    assert_eq!(
        parse(vec!["rls"], Some("10"))
            .unwrap()
            .0
            .memory_max_keys
            .get(),
        10
    );
    assert_eq!(
        parse(vec!["rls", "--max-keys", "7"], Some("10"))
            .unwrap()
            .0
            .memory_max_keys
            .get(),
        7
    );
    assert!(parse(vec!["rls"], Some("0")).is_err());
    assert!(parse(vec!["rls", "--max-keys", "lots"], None).is_err());
}
