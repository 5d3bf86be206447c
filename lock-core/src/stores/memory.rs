//! [`MemoryLocks`]: the lock API in one process, with no server: the lock engine over
//! the memory backend ([`MemoryBackend`]).

use std::sync::Arc;
use std::time::Duration;

use crate::backends::MemoryBackend;
use crate::client::config::LockConfig;
use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::lock::core::Core;
use crate::lock::{LockGuard, LockOptions, Resolved};

/// The guard of a [`MemoryLocks`] lock: the engine's guard on the memory backend.
pub type MemoryGuard = LockGuard<MemoryBackend>;

/// Locks in this process's memory, with the same API and guard semantics as the
/// Redis and database stores: for a service that runs as one instance, and for unit
/// tests of code written against [`DistributedLock`](crate::DistributedLock) without
/// any server.
///
/// - Mutual exclusion between every task of the process that shares this value (it
///   is a cheap `Clone`); two `MemoryLocks::new()` values are separate stores.
/// - Reentrancy per [`LockScope`](crate::LockScope), waiting with the config's wait
///   budget (woken at once by a release), [`LockError::Busy`] with the holder's
///   remaining lease, [`LockError::Timeout`].
/// - Leases follow tokio's clock, so tests under `tokio::time::pause()` can jump past
///   them: a [`Lease::Fixed`](crate::Lease::Fixed) grant ends when its lease does
///   ([`LockGuard::lost`] resolves, another owner may take it). A watchdog grant needs
///   no renewal in one process: it lasts until released (or until
///   [`LockConfig::with_max_hold`] / [`LockOptions::max_hold`] runs out), and
///   [`LockGuard::valid_for`] reports the watchdog lease while it does.
/// - Fencing tokens come from one counter per store, so they grow across every name.
/// - Memory holds only locks that are held, plus expired entries until the next sweep
///   (bounded by twice the live count).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockError, MemoryLocks};
///
/// let locks = MemoryLocks::new();
/// let guard = locks.try_lock(("order", 42_u64)).await?;
/// let again = locks.try_lock(("order", 42_u64)).await; // another scope: busy
/// assert!(matches!(again, Err(LockError::Busy { .. })));
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryLocks {
    inner: Arc<Core<MemoryBackend>>,
}

impl std::fmt::Debug for MemoryLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryLocks")
            .field("held", &self.held_count())
            .field("entries", &self.entries())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryLocks {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLocks {
    /// A store with the default [`LockConfig`].
    pub fn new() -> Self {
        Self::with_config(LockConfig::new())
    }

    /// A store with `config` (lease, wait budget, delimiter, namespace; Redis settings
    /// are unused).
    pub fn with_config(config: LockConfig) -> Self {
        Self {
            inner: Arc::new(Core::new(MemoryBackend::new(config))),
        }
    }

    /// The config this store was built with.
    pub fn config(&self) -> &LockConfig {
        self.inner.config()
    }

    /// Takes the lock if it is free (or re-enters it); [`LockError::Busy`] otherwise.
    pub async fn try_lock<N: LockName>(&self, name: N) -> Result<MemoryGuard, LockError> {
        self.acquire(name, LockOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Takes the lock, waiting up to the config's wait budget.
    pub async fn lock<N: LockName>(&self, name: N) -> Result<MemoryGuard, LockError> {
        self.acquire(name, LockOptions::new()).await
    }

    /// Takes the lock with per-call options.
    pub async fn acquire<N: LockName>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<MemoryGuard, LockError> {
        let config = self.inner.config();
        let resolved = Resolved::new(config, options)?;
        let request = resolved.request(&config.namespace, &name)?;
        self.inner.acquire(&request, resolved.wait).await
    }

    /// Grants held now (one per name and scope, however many holds each has).
    pub fn held_count(&self) -> usize {
        self.inner.registry.held()
    }

    /// Entries in the table: held locks, plus expired ones not swept yet (at most twice
    /// the held ones, plus 64).
    pub fn entries(&self) -> usize {
        self.inner.backend.entries()
    }
}
