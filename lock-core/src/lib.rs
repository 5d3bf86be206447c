//! Distributed locks on Redis for async Rust services.
//!
//! `lock-core` is the engine of the workspace: the `#[cache_lock]` macro (`lock-macros`)
//! and the tower layers (`lock-tower`) are built on it.
//!
//! What a lock gives you, on one Redis node (and, below, on a cluster or N masters):
//! - **Mutual exclusion across processes**: one owner at a time per lock name, taken and
//!   given back by Lua scripts (`lua/` in the repository), each one atomic.
//! - **Reentrancy without threads**: a [`LockScope`] (tokio task-local or passed
//!   explicitly) names the logical operation; taking the same lock again inside it
//!   raises a hold count instead of deadlocking.
//! - **Leases**: a fixed lease, or the watchdog (30 s lease renewed every 10 s by one
//!   scheduler per client, in batches), with an optional cap on total hold time.
//! - **Waiting without spinning**: waiters sleep on the lock's release channel (one
//!   pub/sub connection per client) with jittered exponential backoff as a fallback.
//! - **Knowing when you lost it**: [`LockGuard::lost`] resolves and
//!   [`LockGuard::is_held`] turns false when renewal fails or the lease runs out.
//! - **Fencing tokens**: every grant can take a [`FencingToken`] larger than every
//!   earlier holder's ([`LockGuard::fence`], on demand, or with the grant through
//!   [`LockOptions::fenced`]); [`LockClient::fenced_write`] refuses writes from a stale
//!   holder. A lock taken without one costs a plain `SET NX PX`.
//! - **Clean release on every path**: explicit [`LockGuard::release`] reports
//!   [`Released::Unlocked`], [`Released::StillHeld`], [`LockError::Expired`] or
//!   [`LockError::NotOwner`]; a dropped guard releases in the background.
//! - **Leader election** on any store: an [`Election`] campaigns for one lock; its
//!   [`Leadership`]'s term is the grant's fencing token, its loss the lock's loss, and
//!   [`Election::run`] campaigns again after a loss.
//! - **Semaphores**: [`LockClient::semaphore`] lets at most N holders in at once across
//!   processes; each permit has an id and its own lease, so a crashed holder's come back.
//! - **Order ids**: [`IdGenerator`] issues 64-bit [`OrderId`]s (31 bits of seconds, 32 of
//!   a per-day Redis sequence), unique across processes, per id or in reserved blocks.
//! - **Idempotency records**: [`LockClient::idempotency_store`] claims a key with a
//!   request fingerprint and an in-flight lease, then stores the response for replay or
//!   frees the key ([`Begin`], [`Claim`]); [`LockClient::one_time_tokens`] issues tokens
//!   that exactly one consumer can use.
//! - **Beyond one Redis**: [`LockClient::open_cluster`] runs all of the above on a Redis
//!   Cluster (one hash tag per lock, redirections and failovers followed, renewals
//!   batched per slot); [`Redlock`] takes one lock on a quorum of N independent
//!   masters, with the same guard API ([`RedlockGuard`]).
//! - **Metrics** (the `metrics` feature): acquisitions, waits, holds, renewals, losses,
//!   releases, rate-limit decisions and idempotency outcomes through the `metrics`
//!   facade, with bounded labels; see [`metrics`].
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_core::{Lease, LockClient, LockOptions};
//!
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//!
//! // Fail at once if someone else holds it.
//! let guard = client.try_lock(("voucher", 7_u64)).await?;
//! guard.release().await?;
//!
//! // Wait up to 2 s, with a fixed 5 s lease.
//! let opts = LockOptions::new()
//!     .wait(Duration::from_secs(2))
//!     .lease(Lease::Fixed(Duration::from_secs(5)));
//! let guard = client.acquire(("voucher", 7_u64), opts).await?;
//! let token = guard.fence().await?; // taken on demand: one more round trip
//! client.fenced_write("stock:7", token, 99).await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! Keys: see [`key`] for the layout and why user input cannot forge another lock's key.
//!
//! Redis 7.0 or newer is required (the scripts use the Redis 7 `#!lua` shebang):
//! [`LockClient::open`] and [`LockClient::open_cluster`] read the server's version and
//! refuse an older one with [`LockError::UnsupportedRedis`].

// Lints: `[workspace.lints]` in the workspace Cargo.toml.

// The README's examples compile as doctests, so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod backends;
mod classify;
mod client;
mod election;
mod error;
mod facade;
mod fencing;
mod global;
mod idempotency;
pub mod ids;
pub use client::store::key;
mod lock;
pub mod metrics;
mod owner;
#[doc(hidden)]
pub mod __private {
    //! Re-exported for `#[cache_lock]` and `lock-tower`; not a public API.
    pub use crate::private::*;
}
mod private;
mod rate;
mod redlock;
mod semaphore;
mod stores;
mod traits;

pub use backends::memory::MemoryBackend;
pub use backends::redis::RedisBackend;
pub use backends::redisson::{DEFAULT_FAIR_WAIT, RedissonBackend};
pub use classify::ErrorClass;
pub use client::config::{Backoff, Lease, LockConfig, MAX_LEASE, MIN_LEASE};
pub use client::store::scripts::SOURCES as SCRIPT_SOURCES;
pub use election::{Election, Leadership};
pub use error::LockError;
/// The etcd client crate the etcd store is built on (to hand in a client, and for the
/// operations of [`EtcdLocks::write_fenced`]).
#[cfg(feature = "etcd")]
pub use etcd_client;
pub use facade::LockClient;
pub use fencing::FencedWrite;
pub use global::{global, install_global};
pub use idempotency::{Begin, Claim, IdempotencyKeys, IdempotencyStore, OneTimeTokens};
pub use ids::{IdGenerator, OrderId};
pub use key::{KeyPart, LockKeys, LockMode, LockName};
pub use lock::seam::Backend;
pub use lock::{LockGuard, LockOptions, Released};
pub use owner::{ClientId, FencingToken, LockScope};
pub use rate::{Decision, LimitRule, RateLimit, RateLimiter, RuleDecision, RuleLimiter};
pub use redlock::{DEFAULT_NODE_TIMEOUT, Redlock, RedlockBackend, RedlockGuard};
pub use semaphore::{MAX_PERMITS_PER_ACQUIRE, Permits, Semaphore, SemaphoreOptions};
pub use stores::{
    AnyGuard, AnyLocks, Locks, MemoryGuard, MemoryLocks, RedissonGuard, RedissonLocks,
};
#[cfg(feature = "etcd")]
pub use stores::{EtcdBackend, EtcdGuard, EtcdHolder, EtcdLocks};
#[cfg(feature = "mysql")]
pub use stores::{MYSQL_FENCE_TABLE, MysqlBackend, MysqlGuard, MysqlLocks};
#[cfg(feature = "postgres")]
pub use stores::{POSTGRES_FENCE_SEQUENCE, PostgresBackend, PostgresGuard, PostgresLocks};
#[cfg(feature = "zookeeper")]
pub use stores::{ZkBackend, ZkGuard, ZkLocks};
pub use traits::{DistributedLock, HeldLock};
/// The ZooKeeper client crate the ZooKeeper store is built on (to hand in a session).
#[cfg(feature = "zookeeper")]
pub use zookeeper_client;
