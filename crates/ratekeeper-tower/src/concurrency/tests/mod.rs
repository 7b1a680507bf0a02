//! The concurrency middleware end to end, one file per kind of limit.

mod adaptive;
mod failure;
