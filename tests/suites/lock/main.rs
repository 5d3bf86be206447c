//! The lock of `LockClient` on one redis-server: reentrancy, waiting, the watchdog,
//! lost locks, cancellation, fencing, restarts, runtimes, batching (and the release
//! script's batch against its entries one by one), pipelining and input checks.
//! Every test starts its own server, so the modules run side by side.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod batching;
mod batching_read_write;
mod cancellation;
mod connection;
mod fencing;
mod full_server;
mod lost;
mod pipelining;
mod reentrancy;
mod release_batch;
mod restart;
mod runtimes;
mod script_flush;
mod server_checks;
mod waiters;
mod watchdog;
