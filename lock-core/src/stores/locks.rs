//! [`Locks<B>`]: the handle of a lock store other than Redis, once for every backend
//! ([`MemoryLocks`](crate::MemoryLocks), `PostgresLocks`, `MysqlLocks`, `ZkLocks` are
//! `Locks` over their backend, each with its own constructors).

use std::sync::Arc;
use std::time::Duration;

use crate::client::config::LockConfig;
use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::lock::core::Core;
use crate::lock::seam::Backend;
use crate::lock::{LockGuard, LockOptions};

/// Locks on the store `B`: the lock engine over one backend. Cheap to clone; clones
/// share the store and the registry of what this handle's scopes hold.
///
/// Behavior, on every store:
/// - [`acquire`](Self::acquire) waits up to the options' budget (else the config's),
///   and fails with [`LockError::Busy`] (no wait) or [`LockError::Timeout`];
/// - acquisitions in one [`LockScope`](crate::LockScope) re-enter: one grant per name
///   and scope, given back with its last guard;
/// - the guard is the engine's [`LockGuard<B>`], with `lost()`, `is_held()`,
///   `valid_for()`, a fencing token and the same release results as on Redis.
pub struct Locks<B: Backend> {
    pub(crate) inner: Arc<Core<B>>,
}

impl<B: Backend> Clone for Locks<B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Locks<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locks")
            .field("store", &self.inner.backend.kind())
            .field("held", &self.held_count())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Locks<B> {
    pub(crate) fn over(backend: B) -> Self {
        Self {
            inner: Arc::new(Core::new(backend)),
        }
    }

    /// The config this store was built with.
    pub fn config(&self) -> &LockConfig {
        self.inner.config()
    }

    /// Takes the lock if it is free (or re-enters it); [`LockError::Busy`] otherwise.
    pub async fn try_lock<N: LockName>(&self, name: N) -> Result<LockGuard<B>, LockError> {
        self.acquire(name, LockOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Takes the lock, waiting up to the config's wait budget.
    pub async fn lock<N: LockName>(&self, name: N) -> Result<LockGuard<B>, LockError> {
        self.acquire(name, LockOptions::new()).await
    }

    /// Takes the lock with per-call options (wait, lease, scope, delimiter; a session
    /// store applies no fixed lease and no max-hold).
    pub async fn acquire<N: LockName>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<LockGuard<B>, LockError> {
        self.inner.acquire_named(name, options).await
    }

    /// Grants held now (one per name and scope, however many holds each has).
    pub fn held_count(&self) -> usize {
        self.inner.registry.held()
    }

    /// The store's backend.
    pub(crate) fn backend(&self) -> &B {
        &self.inner.backend
    }
}
