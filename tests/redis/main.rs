//! The shared stores against real `redis-server` processes (standalone and Cluster, each
//! started by the test on free loopback ports and killed when it ends): the Redis store's
//! conformance and exactness, the sliding log and reservations at scale, the shared
//! concurrency slots, faults (kill, pause, flush, failover), a fleet of instances at start and
//! through an outage, and the tiered (lease) store.

mod bans;
mod correct;
mod credentials;
mod deadline;
mod declared;
mod differential;
mod faults;
mod fleet;
mod invalidation;
mod refund_order;
mod reset;
mod scale;
mod shared_handle;
mod slots;
mod store;
mod tiered;
mod usage;

// The `distributed` example app itself, not a copy (the `store` and `tiered` modules drive
// it); its `main` and the items no module uses are dead code here.
#[allow(dead_code, unreachable_pub)]
#[path = "../../examples/redis/distributed.rs"]
mod distributed;
