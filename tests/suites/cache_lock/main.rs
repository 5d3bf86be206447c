//! `#[cache_lock]` with an explicit client, on Redis and on an axum handler. The
//! process-wide client has binaries of its own (`global_redis.rs`, `global_memory.rs`):
//! it is installed once per process.

#[path = "../common/mod.rs"]
mod common;

mod axum_handler;
mod on_redis;
