//! [`MemoryLocks`]: the lock API in one process, with no server: the lock engine over
//! the memory backend ([`MemoryBackend`]).

use super::locks::Locks;
use crate::backends::MemoryBackend;
use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockName};
use crate::error::LockError;
use crate::lock::LockGuard;

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
///   budget (woken at once by a release), [`LockError::Busy`](crate::LockError::Busy) with the holder's
///   remaining lease, [`LockError::Timeout`](crate::LockError::Timeout).
/// - Leases follow tokio's clock, so tests under `tokio::time::pause()` can jump past
///   them: a [`Lease::Fixed`](crate::Lease::Fixed) grant ends when its lease does
///   ([`LockGuard::lost`] resolves, another owner may take it). A watchdog grant needs
///   no renewal in one process: it lasts until released (or until
///   [`LockConfig::with_max_hold`] / [`LockOptions::max_hold`](crate::LockOptions::max_hold) runs out), and
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
pub type MemoryLocks = Locks<MemoryBackend>;

impl Default for Locks<MemoryBackend> {
    fn default() -> Self {
        Self::new()
    }
}

impl Locks<MemoryBackend> {
    /// A store with the default [`LockConfig`].
    pub fn new() -> Self {
        Self::over(MemoryBackend::new(LockConfig::new()))
    }

    /// A store with `config` (lease, wait budget, delimiter, namespace; Redis settings
    /// are unused). Fails with [`LockError::InvalidConfig`] for a config that
    /// [`LockConfig::validate`] refuses, as every other store does.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{LockConfig, MemoryLocks};
    ///
    /// let locks = MemoryLocks::with_config(LockConfig::new().with_wait(Duration::ZERO))?;
    /// assert!(MemoryLocks::with_config(LockConfig::new().with_delimiter("")).is_err());
    /// # Ok::<(), lock_core::LockError>(())
    /// ```
    pub fn with_config(config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        Ok(Self::over(MemoryBackend::new(config)))
    }

    /// Entries in the table: held locks, plus expired ones not swept yet (at most twice
    /// the held ones, plus 64).
    pub fn entries(&self) -> usize {
        self.backend().entries()
    }

    /// How many waiters of the fair lock `name` ([`LockOptions::fair`](crate::LockOptions::fair))
    /// stand in its line now, places that lapsed included until the next attempt.
    ///
    /// ```
    /// let locks = lock_core::MemoryLocks::new();
    /// assert_eq!(locks.in_line("printer").unwrap(), 0);
    /// ```
    pub fn in_line<N: LockName>(&self, name: N) -> Result<usize, LockError> {
        let config = self.config();
        let keys = key::lock_keys(&config.namespace, &config.delimiter, &name)?;
        Ok(self.backend().in_line(&keys.key))
    }
}
