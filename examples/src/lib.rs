//! Runnable programs built on the workspace crates.
//!
//! - [`seckill`]: the flash-sale service (`seckill-server`) and its load generator
//!   (`seckill-load`), the main job `scripts/demo` runs.
//! - `lock-demo` (a binary only): two OS processes taking turns on one lock.

// Lints: `[workspace.lints]` in the workspace Cargo.toml.

pub mod seckill;
