//! Prints the Redis store's limiter script (or, with the argument `lease`, its lease
//! script) as sent with `EVAL`, for scripts that call it from a bare client
//! (`scripts/redis_sliding_log_cost.sh`). Its arguments follow the store's private
//! protocol (`store/redis/protocol.rs` in `ratekeeper-core`).

use ratekeeper_axum::core::store::redis::RedisStore;

fn main() -> Result<(), String> {
    let [limiter, lease] = RedisStore::script_texts();
    match std::env::args().nth(1).as_deref() {
        None | Some("limiter") => print!("{limiter}"),
        Some("lease") => print!("{lease}"),
        Some(other) => return Err(format!("limiter or lease, not {other:?}")),
    }
    Ok(())
}
