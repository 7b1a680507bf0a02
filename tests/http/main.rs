//! The layer over real HTTP on loopback (and, where a case needs other peers or a bare
//! service, through `oneshot`): algorithms, keys, headers, modes, refunds, CORS, upgrades,
//! middleware stacks, metrics, logs and exemptions. Time is a manual clock or tokio's paused clock
//! unless a module says otherwise; the modules that use Redis start their own
//! `redis-server`.

mod admin;
mod advertised_quota;
mod algorithms;
mod bans;
mod cors;
mod credentials;
mod delay_drops;
mod exempt;
mod header_merge;
mod headers;
mod keys;
mod logs;
mod metrics;
mod missing_key;
mod modes;
mod refunds;
mod stacks;
mod trust;
mod unavailable;
mod upgrades;
mod usage;
