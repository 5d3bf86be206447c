//! `#[cache_lock]`: a Redis lock around an async fn, the Rust form of the Java
//! `@CacheLock` aspect.
//!
//! Not built yet. This crate will hold the attribute macro
//! `#[cache_lock(prefix = "...", key = arg, expire = "10s", wait = "0s")]`, which takes a
//! `lock-core` lock named from the prefix and the chosen arguments before the body runs,
//! rejects a concurrent duplicate with a `LockError`, re-enters on nested calls with the
//! same key, and releases on every exit path. Until then it exports nothing.
