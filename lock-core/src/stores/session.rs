//! What every non-Redis store shares: reentrancy per [`LockScope`] counted in the
//! client, and one guard type ([`StoreGuard`]) over a store's grant ([`Hold`]).
//!
//! A store implements [`Hold`] for one grant (a map entry, a database session, a
//! ZooKeeper node) and [`Stores::acquire`] calls it only for a fresh grant: a second
//! acquisition of the same name in the same scope re-enters the live grant without
//! asking the store, and acquisitions of one name in one scope are taken one at a time
//! (so two tasks of a scope never both ask the store and deadlock on each other). The
//! grant is given back when its last guard is released or dropped.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockName};
use crate::error::LockError;
use crate::lock::LockOptions;
use crate::lock::Released;
use crate::lock::Resolved;
use crate::lock::release_outcome;
use crate::metrics::{self, StoreKind};
use crate::owner::FencingToken;

/// A boxed `Send` future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// One grant of a store.
pub(crate) trait Hold: Send + Sync + 'static {
    /// How long the grant is known to last from now (zero once lost).
    fn valid_for(&self) -> Duration;
    /// The grant's fencing token, if the store issues one.
    fn token(&self) -> Option<FencingToken>;
    /// Resolves when the grant is lost; never while it is held.
    fn lost(&self) -> BoxFuture<()>;
    /// Gives the grant back: `Ok` if it was still ours, [`LockError::Expired`] or
    /// [`LockError::NotOwner`] if it was lost first, another error if the store failed.
    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>>;
    /// Gives the grant back without waiting (a dropped guard). Must not block.
    fn release_in_background(self: Box<Self>);
    /// Keeps the grant until its lease ends, without renewal, where the store can;
    /// stores without leases release it.
    fn hold_until_expiry(self: Box<Self>) {
        self.release_in_background();
    }
}

type Slot = Arc<tokio::sync::Mutex<Weak<Shared>>>;

/// The reentrancy table of one store client: (lock name, scope) -> its live grant.
pub(crate) struct Stores {
    slots: Mutex<HashMap<(String, u64), Slot>>,
    /// The `store` label of its metrics.
    kind: StoreKind,
}

impl fmt::Debug for Stores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stores")
            .field("names", &self.slots().len())
            .finish()
    }
}

impl Stores {
    pub(crate) fn new(kind: StoreKind) -> Self {
        Self {
            slots: Mutex::default(),
            kind,
        }
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<(String, u64), Slot>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Grants held now (one per name and scope, however many holds each has).
    pub(crate) fn held_count(&self) -> usize {
        self.slots()
            .values()
            .filter(|s| s.try_lock().map_or(true, |w| w.strong_count() > 0))
            .count()
    }

    /// The one acquisition path of every store here: resolves `options` against
    /// `config`, then re-enters the live grant of `name` in the scope, or takes a fresh
    /// one with `take(escaped name, resolved options)`.
    pub(crate) async fn acquire_named<N, H, F, Fut>(
        self: &Arc<Self>,
        config: &LockConfig,
        name: N,
        options: LockOptions,
        take: F,
    ) -> Result<StoreGuard, LockError>
    where
        N: LockName,
        H: Hold,
        F: FnOnce(String, &Resolved<'_>) -> Fut,
        Fut: Future<Output = Result<H, LockError>>,
    {
        let how = Resolved::new(config, options)?;
        let name = key::escaped_name(how.delimiter, &name)?;
        let scope = how.scope.id();
        let taken = take(name.clone(), &how);
        let fresh = async move { Ok(Box::new(taken.await?) as Box<dyn Hold>) };
        let started = Instant::now();
        let mut reentered = false;
        let result = self.acquire(&name, scope, fresh, &mut reentered).await;
        let outcome = metrics::Acquired::of(&result, reentered);
        metrics::acquired(self.kind, outcome, started.elapsed());
        result
    }

    /// Re-enters the live grant of `name` in `scope` (setting `reentered`), or takes a
    /// fresh one with `fresh` (called with no other acquisition of `name` in `scope`
    /// under way).
    async fn acquire<F>(
        self: &Arc<Self>,
        name: &str,
        scope: u64,
        fresh: F,
        reentered: &mut bool,
    ) -> Result<StoreGuard, LockError>
    where
        F: Future<Output = Result<Box<dyn Hold>, LockError>>,
    {
        let id = (name.to_owned(), scope);
        // Drops the slot from the table if this attempt leaves it unused (declared
        // first, so it runs after our own handle on the slot is gone).
        let _tidy = Tidy {
            stores: self,
            id: &id,
        };
        let slot = self.slots().entry(id.clone()).or_default().clone();
        let mut live = slot.lock().await;
        if let Some(shared) = live.upgrade()
            && !shared.valid_for().is_zero()
        {
            tracing::debug!(lock = %name, "lock re-entered");
            *reentered = true;
            return Ok(StoreGuard { shared });
        }
        let hold = fresh.await?;
        let shared = Arc::new(Shared {
            hold: Mutex::new(Some(hold)),
            home: Arc::downgrade(self),
            id: id.clone(),
            kind: self.kind,
            granted: Instant::now(),
        });
        *live = Arc::downgrade(&shared);
        Ok(StoreGuard { shared })
    }

    /// Removes the slot of `id` if no grant lives in it and nobody waits on it.
    fn tidy(&self, id: &(String, u64)) {
        let mut slots = self.slots();
        if let Some(slot) = slots.get(id)
            && Arc::strong_count(slot) == 1
            && slot.try_lock().is_ok_and(|w| w.strong_count() == 0)
        {
            slots.remove(id);
        }
    }
}

struct Tidy<'a> {
    stores: &'a Stores,
    id: &'a (String, u64),
}

impl Drop for Tidy<'_> {
    fn drop(&mut self) {
        self.stores.tidy(self.id);
    }
}

/// The conveniences every store here has beside its `acquire`: `try_lock`, `lock`,
/// `held_count` (for a store whose `inner` holds its [`Stores`] as `stores`).
///
/// `store_conveniences!(target)` also writes `acquire`, for a store whose
/// `inner.take(name, target, wait)` takes the lock at `target(namespace, name)` (the
/// server-side name, advisory key or node path), waiting up to `wait`.
macro_rules! store_conveniences {
    ($target:path) => {
        /// Takes the lock with per-call options (wait, scope, delimiter).
        pub async fn acquire<N: crate::client::store::key::LockName>(
            &self,
            name: N,
            options: crate::LockOptions,
        ) -> Result<crate::StoreGuard, crate::LockError> {
            let inner = self.inner.clone();
            let namespace = &self.inner.config.namespace;
            self.inner
                .stores
                .acquire_named(&self.inner.config, name, options, |name, how| {
                    let (target, wait) = ($target(namespace, &name), how.wait);
                    async move { inner.take(name, target, wait).await }
                })
                .await
        }

        $crate::stores::session::store_conveniences!();
    };
    () => {
        /// Takes the lock if it is free (or re-enters it); [`LockError::Busy`] otherwise.
        pub async fn try_lock<N: crate::client::store::key::LockName>(
            &self,
            name: N,
        ) -> Result<crate::StoreGuard, crate::LockError> {
            self.acquire(
                name,
                crate::LockOptions::new().wait(std::time::Duration::ZERO),
            )
            .await
        }

        /// Takes the lock, waiting up to the config's wait budget.
        pub async fn lock<N: crate::client::store::key::LockName>(
            &self,
            name: N,
        ) -> Result<crate::StoreGuard, crate::LockError> {
            self.acquire(name, crate::LockOptions::new()).await
        }

        /// Grants held now (one per name and scope).
        pub fn held_count(&self) -> usize {
            self.inner.stores.held_count()
        }
    };
}
pub(crate) use store_conveniences;

/// One grant and its holds (one `Arc` per guard).
struct Shared {
    hold: Mutex<Option<Box<dyn Hold>>>,
    home: Weak<Stores>,
    /// The lock's name and the scope: its slot in `home`.
    id: (String, u64),
    kind: StoreKind,
    granted: Instant,
}

impl Shared {
    fn name(&self) -> &str {
        &self.id.0
    }

    fn hold(&self) -> MutexGuard<'_, Option<Box<dyn Hold>>> {
        self.hold.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn valid_for(&self) -> Duration {
        self.hold()
            .as_ref()
            .map_or(Duration::ZERO, |h| h.valid_for())
    }

    fn take(&self) -> Option<Box<dyn Hold>> {
        self.hold().take()
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(hold) = self.take() {
            hold.release_in_background();
        }
        if let Some(home) = self.home.upgrade() {
            // Our Weak in the slot is dead now, so the slot can go unless in use.
            home.tidy(&self.id);
        }
    }
}

/// A held lock of a non-Redis store ([`MemoryLocks`](crate::MemoryLocks) and the
/// database and ZooKeeper stores): the same API as [`LockGuard`](crate::LockGuard).
///
/// - Guards of one name in one [`LockScope`](crate::LockScope) share one grant; the
///   grant is given back when the last of them is released or dropped.
/// - [`release`](Self::release) reports [`Released::Unlocked`],
///   [`Released::StillHeld`], or [`LockError::Expired`] / [`LockError::NotOwner`] if
///   the grant was lost first.
/// - [`lost`](Self::lost) resolves when the store takes the grant away (lease ended,
///   session killed or expired).
#[must_use = "dropping a StoreGuard releases the lock at once"]
pub struct StoreGuard {
    shared: Arc<Shared>,
}

impl fmt::Debug for StoreGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreGuard")
            .field("lock", &self.shared.name())
            .field("token", &self.fencing_token())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl StoreGuard {
    /// The lock's name as the store sees it (parts escaped and joined).
    pub fn name(&self) -> &str {
        self.shared.name()
    }

    /// True while the grant is known to be held.
    pub fn is_held(&self) -> bool {
        !self.valid_for().is_zero()
    }

    /// How long the grant is known to last from now (zero once lost).
    pub fn valid_for(&self) -> Duration {
        self.shared.valid_for()
    }

    /// The grant's fencing token, where the store issues one (every store of this
    /// crate does; see each store's page for where it comes from).
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.shared.hold().as_ref().and_then(|h| h.token())
    }

    /// Resolves when the grant is lost; never while it is held. Race it against the
    /// critical section.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost = self.shared.hold().as_ref().map(|h| h.lost());
        async move {
            // `None`: already given back by another hold's release; nothing to wait for.
            if let Some(lost) = lost {
                lost.await;
            }
        }
    }

    /// Takes the same lock again in the same grant (no store call, no waiting).
    pub fn reenter(&self) -> Result<StoreGuard, LockError> {
        if self.is_held() {
            Ok(StoreGuard {
                shared: self.shared.clone(),
            })
        } else {
            Err(LockError::Expired {
                key: self.shared.name().to_owned(),
            })
        }
    }

    /// Gives back this hold; the grant goes back to the store with the last one.
    pub async fn release(self) -> Result<Released, LockError> {
        let others = Arc::strong_count(&self.shared) - 1;
        let name = self.shared.name().to_owned();
        let (kind, granted) = (self.shared.kind, self.shared.granted);
        let result = match Arc::into_inner(self.shared) {
            Some(shared) => match shared.take() {
                Some(hold) => hold.release().await.map(|()| Released::Unlocked),
                None => Err(LockError::Expired { key: name }),
            },
            None => Ok(Released::StillHeld {
                holds_left: u32::try_from(others.max(1)).unwrap_or(u32::MAX),
            }),
        };
        let last = !matches!(result, Ok(Released::StillHeld { .. }));
        metrics::release(
            kind,
            release_outcome(&result),
            last.then(|| granted.elapsed()),
        );
        result
    }

    /// Keeps the grant until its lease runs out (an anti-resubmit window) where the
    /// store has leases; stores whose grants live with a session release it.
    pub fn hold_until_expiry(self) {
        if let Some(shared) = Arc::into_inner(self.shared)
            && let Some(hold) = shared.take()
        {
            hold.hold_until_expiry();
        }
    }
}
