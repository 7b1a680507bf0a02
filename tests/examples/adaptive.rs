//! The `adaptive` example over real HTTP: a flood of sheddable requests is shed with 503s,
//! while checkouts (the critical partition) keep getting through.

use ratekeeper_tests::TestServer;

// The example app itself, not a copy; its `main` and the items this file does not use
// are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/adaptive.rs"]
mod adaptive;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sheddable_flood_is_shed_and_checkouts_keep_their_share() {
    let server = TestServer::start(adaptive::app()).await;
    // 40 browsing requests at once: far more than 4 workers serve in 50 ms, and more than
    // the limit can be (it starts by measuring the minimum latency at 2 in flight).
    let flood: Vec<_> = (0..40)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move {
                let res = server.get("/browse").send().await.unwrap();
                let status = res.status().as_u16();
                let retry_after = res
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                let content_type = res
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body = res.text().await.unwrap();
                (status, retry_after, content_type, body)
            })
        })
        .collect();
    // Checkouts one after another during the flood: each finds the critical partition
    // below its guaranteed share (at least 1 of any limit of 2 or more), so none is shed.
    for _ in 0..5 {
        let res = server.get("/checkout").send().await.unwrap();
        assert_eq!(res.status(), 200);
        assert_eq!(res.text().await.unwrap(), "done\n");
    }
    let mut shed = 0;
    let mut served = 0;
    for task in flood {
        let (status, retry_after, content_type, body) = task.await.unwrap();
        match status {
            200 => {
                served += 1;
                assert_eq!(body, "done\n");
            }
            503 => {
                shed += 1;
                assert_eq!(retry_after.as_deref(), Some("1"));
                assert_eq!(content_type.as_deref(), Some("application/problem+json"));
                let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
                assert_eq!(
                    problem["type"],
                    "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
                );
                assert_eq!(problem["status"], 503);
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(served >= 1, "nothing served");
    assert!(shed >= 1, "nothing shed: {served} served");
}
