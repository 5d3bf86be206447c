//! The public lock trait: what every lock store offers, so code (and `#[cache_lock]`)
//! can be written once for a [`LockClient`](crate::LockClient) on one Redis or a
//! Cluster, a [`Redlock`](crate::Redlock) over N masters, and other stores.

use std::future::Future;
use std::time::Duration;

use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::lock::seam::Backend;
use crate::lock::{LockGuard, LockOptions, Released};
use crate::owner::FencingToken;
use crate::stores::locks::Locks;

/// A store of distributed locks.
///
/// Behavior every implementation keeps:
/// - [`acquire`](Self::acquire) waits up to the options' budget (else the store's
///   default) and fails with [`LockError::Busy`] (no wait) or [`LockError::Timeout`];
///   a store failure is an error of its own ([`LockError::is_redis`] on Redis).
/// - Acquisitions in one [`LockScope`](crate::LockScope) re-enter.
/// - The guard ([`HeldLock`]) reports loss, validity and release results the same way.
///
/// ```no_run
/// use lock_core::{DistributedLock, HeldLock, LockError};
///
/// async fn once_at_a_time<L: DistributedLock>(locks: &L) -> Result<(), LockError> {
///     let guard = locks.try_lock_named("nightly-report").await?;
///     // ... the work; stop if guard.lost() resolves ...
///     guard.release().await?;
///     Ok(())
/// }
/// ```
pub trait DistributedLock: Send + Sync {
    /// The guard of a held lock.
    type Guard: HeldLock;

    /// Takes the lock `name` with per-call options.
    fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send;

    /// Takes the lock if it is free (or re-enters it); [`LockError::Busy`] otherwise.
    fn try_lock_named<N: LockName + Send + Sync>(
        &self,
        name: N,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        self.acquire(name, LockOptions::new().wait(Duration::ZERO))
    }

    /// Takes the lock, waiting up to the store's default budget.
    fn lock_named<N: LockName + Send + Sync>(
        &self,
        name: N,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        self.acquire(name, LockOptions::new())
    }
}

/// A held lock, whatever its store.
pub trait HeldLock: Send + Sync + 'static {
    /// The lock's name as stored.
    fn name(&self) -> &str;
    /// True while the lock is known to be held.
    fn is_held(&self) -> bool;
    /// How long the lock is known to stay held from now (zero once lost).
    fn valid_for(&self) -> Duration;
    /// The fencing token of this grant if it was taken already (Redis locks take it on
    /// demand: see [`fence`](Self::fence)); `None` where the store issues none.
    fn token(&self) -> Option<FencingToken>;
    /// The fencing token of this grant, taken now if the store takes tokens on demand
    /// (Redis: one round trip, see [`LockGuard::fence`](crate::LockGuard::fence));
    /// `Ok(None)` where the store issues none.
    fn fence(&self) -> impl Future<Output = Result<Option<FencingToken>, LockError>> + Send {
        std::future::ready(Ok(self.token()))
    }
    /// Resolves when the lock is lost; never while it is held, nor once given up.
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static;
    /// Gives back this hold.
    fn release(self) -> impl Future<Output = Result<Released, LockError>> + Send;
    /// Keeps the lock until its lease runs out (no release, no renewal).
    fn hold_until_expiry(self);
}

impl DistributedLock for crate::LockClient {
    type Guard = LockGuard;

    fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        crate::LockClient::acquire(self, name, options)
    }
}

impl<B: Backend> DistributedLock for Locks<B> {
    type Guard = LockGuard<B>;

    fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        Locks::acquire(self, name, options)
    }
}

impl<B: Backend> HeldLock for LockGuard<B> {
    fn name(&self) -> &str {
        LockGuard::name(self)
    }
    fn is_held(&self) -> bool {
        LockGuard::is_held(self)
    }
    fn valid_for(&self) -> Duration {
        LockGuard::valid_for(self)
    }
    fn token(&self) -> Option<FencingToken> {
        LockGuard::fencing_token(self)
    }
    async fn fence(&self) -> Result<Option<FencingToken>, LockError> {
        match LockGuard::fence(self).await {
            Ok(token) => Ok(Some(token)),
            // A grant with no token to give: the trait's `None`.
            Err(LockError::NoFencingToken { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        LockGuard::lost(self)
    }
    fn release(self) -> impl Future<Output = Result<Released, LockError>> + Send {
        LockGuard::release(self)
    }
    fn hold_until_expiry(self) {
        LockGuard::hold_until_expiry(self)
    }
}

impl<T: DistributedLock + ?Sized> DistributedLock for &T {
    type Guard = T::Guard;

    fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        (**self).acquire(name, options)
    }
}

impl<T: DistributedLock + ?Sized> DistributedLock for std::sync::Arc<T> {
    type Guard = T::Guard;

    fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        (**self).acquire(name, options)
    }
}
