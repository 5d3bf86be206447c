//! Runnable programs built on the workspace crates.
//!
//! - [`seckill`]: the flash-sale service (`seckill-server`) and its load generator
//!   (`seckill-load`), the main job `scripts/demo` runs.
//! - `lock-demo` (a binary only): two OS processes taking turns on one lock.
//! - Small programs, one feature each (binaries; [`programs`] holds what they share):
//!   `cache-lock-axum` (an axum handler with `#[cache_lock]`), `payments` (an idempotent
//!   endpoint behind `IdempotencyLayer`), `rate-limited-api` (`RateLimitLayer`),
//!   `redlock` (a lock over several masters) and `lock-by-url` (Redis, PostgreSQL, MySQL,
//!   ZooKeeper or memory, chosen by URL). `tests/programs.rs` runs each of them.

// Lints: `[workspace.lints]` in the workspace Cargo.toml.

pub mod programs;
pub mod seckill;
