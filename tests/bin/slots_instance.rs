//! A shared-concurrency app instance as its own process, so a test can `kill -9` it:
//! `slots_instance <standalone|cluster> <url[,url...]> <prefix> <max> <lease ms> <hold ms>`
//! (lease 0: the default lease). Prints `ADDR <ip:port>` once it listens on loopback.

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use ratekeeper_tests::slots::{Backend, InFlight, instance};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, kind, urls, prefix, max, lease, hold] = args.as_slice() else {
        eprintln!(
            "usage: slots_instance <standalone|cluster> <urls> <prefix> <max> <lease ms> <hold ms>"
        );
        std::process::exit(2);
    };
    let Some(backend) = Backend::from_args(kind, urls) else {
        eprintln!("unknown backend {kind}");
        std::process::exit(2);
    };
    let parse = |s: &str| {
        s.parse::<u64>().unwrap_or_else(|_| {
            eprintln!("not a number: {s}");
            std::process::exit(2);
        })
    };
    let (max, lease, hold) = (parse(max), parse(lease), parse(hold));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let app = instance(
            &backend,
            prefix,
            u32::try_from(max).unwrap_or(u32::MAX),
            Duration::from_millis(lease),
            Duration::from_millis(hold),
            Arc::new(InFlight::default()),
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        println!("ADDR {addr}");
        std::io::stdout().flush().expect("flush stdout");
        axum::serve(listener, app).await.expect("serve");
    });
}
