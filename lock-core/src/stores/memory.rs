//! [`MemoryLocks`]: the lock API in one process, with no server.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::session::{BoxFuture, Hold, StoreGuard, Stores};
use crate::client::config::LockConfig;
use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::lock::LockOptions;
use crate::owner::FencingToken;

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
///   ([`StoreGuard::lost`] resolves, another owner may take it). A watchdog grant needs
///   no renewal in one process: it lasts until released (or until
///   [`LockConfig::with_max_hold`] / [`LockOptions::max_hold`] runs out), and
///   [`StoreGuard::valid_for`] reports the watchdog lease while it does.
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
#[derive(Clone, Debug)]
pub struct MemoryLocks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: LockConfig,
    table: Mutex<Table>,
    released: Notify,
    tokens: AtomicU64,
    stores: Arc<Stores>,
}

#[derive(Debug, Default)]
struct Table {
    locks: HashMap<String, Entry>,
    /// Entries left after the last sweep of expired ones.
    after_sweep: usize,
}

#[derive(Debug)]
struct Entry {
    grant: u64,
    /// `None`: held until released.
    until: Option<Instant>,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| u > now)
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

    /// A store with `config` (lease, wait budget, delimiter; Redis settings are unused).
    pub fn with_config(config: LockConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                table: Mutex::new(Table::default()),
                released: Notify::new(),
                tokens: AtomicU64::new(0),
                stores: Arc::new(Stores::new(crate::metrics::StoreKind::Memory)),
            }),
        }
    }

    /// The config this store was built with.
    pub fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    super::session::store_conveniences!();

    /// Takes the lock with per-call options.
    pub async fn acquire<N: LockName>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<StoreGuard, LockError> {
        let inner = self.inner.clone();
        let stores = &self.inner.stores;
        stores
            .acquire_named(&self.inner.config, name, options, |name, how| {
                let lease = (!how.watchdog).then_some(how.lease).or(how.max_hold);
                let wait = how.wait;
                async move { inner.take(&name, lease, wait).await }
            })
            .await
    }

    /// Entries in the table: held locks, plus expired ones not swept yet (at most twice
    /// the held ones, plus 64).
    pub fn entries(&self) -> usize {
        self.inner.table().locks.len()
    }
}

impl Inner {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for `name` to be free (up to `wait`) and takes it for `lease` (`None`:
    /// until released).
    async fn take(
        self: Arc<Self>,
        name: &str,
        lease: Option<Duration>,
        wait: Duration,
    ) -> Result<MemoryHold, LockError> {
        let started = Instant::now();
        let deadline = started.checked_add(wait);
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let now = Instant::now();
            let busy_until = {
                let mut table = self.table();
                match table.locks.get(name) {
                    Some(e) if e.live(now) => e.until,
                    _ => {
                        let grant = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
                        let until = lease.and_then(|l| now.checked_add(l));
                        table.insert(name, Entry { grant, until }, now);
                        return Ok(MemoryHold {
                            store: self.clone(),
                            name: name.to_owned(),
                            grant,
                            until,
                        });
                    }
                }
            };
            let retry_after = busy_until.map_or(self.config.watchdog_lease(), |u| u - now);
            if wait.is_zero() {
                return Err(LockError::Busy {
                    key: name.to_owned(),
                    retry_after,
                });
            }
            let wake = match (deadline, busy_until) {
                (Some(d), Some(u)) => Some(d.min(u)),
                (d, u) => d.or(u),
            };
            if deadline.is_some_and(|d| now >= d) {
                return Err(LockError::Timeout {
                    key: name.to_owned(),
                    waited: now - started,
                });
            }
            match wake {
                Some(at) => {
                    tokio::select! {
                        () = &mut released => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => released.await,
            }
        }
    }

    /// Removes `name` if grant `grant` holds it: `Ok` if it was live, `Expired` or
    /// `NotOwner` if it had ended first.
    fn give_back(&self, name: &str, grant: u64) -> Result<(), LockError> {
        let now = Instant::now();
        let mut table = self.table();
        let outcome = match table.locks.get(name) {
            Some(e) if e.grant == grant => {
                let live = e.live(now);
                table.locks.remove(name);
                if live {
                    Ok(())
                } else {
                    Err(LockError::Expired {
                        key: name.to_owned(),
                    })
                }
            }
            Some(e) if e.live(now) => Err(LockError::NotOwner {
                key: name.to_owned(),
            }),
            _ => Err(LockError::Expired {
                key: name.to_owned(),
            }),
        };
        drop(table);
        self.released.notify_waiters();
        outcome
    }
}

impl Table {
    fn insert(&mut self, name: &str, entry: Entry, now: Instant) {
        self.locks.insert(name.to_owned(), entry);
        // Expired entries nobody took again go in sweeps, so memory stays within
        // twice what is held.
        if self.locks.len() > 2 * self.after_sweep + 64 {
            self.locks.retain(|_, e| e.live(now));
            self.after_sweep = self.locks.len();
        }
    }
}

/// One grant of a [`MemoryLocks`].
struct MemoryHold {
    store: Arc<Inner>,
    name: String,
    grant: u64,
    until: Option<Instant>,
}

impl Hold for MemoryHold {
    fn valid_for(&self) -> Duration {
        // From the grant's own lease, not from the table: only a release (which
        // consumes the hold) or the lease's end can take an entry away, so the two agree,
        // and the randomized test can check the table against this belief.
        match self.until {
            Some(u) => u.saturating_duration_since(Instant::now()),
            None => self.store.config.watchdog_lease(),
        }
    }

    fn token(&self) -> Option<FencingToken> {
        Some(FencingToken::new(self.grant, self.grant))
    }

    fn lost(&self) -> BoxFuture<()> {
        let until = self.until;
        Box::pin(async move {
            match until {
                Some(u) => tokio::time::sleep_until(u).await,
                None => std::future::pending().await,
            }
        })
    }

    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>> {
        let outcome = self.store.give_back(&self.name, self.grant);
        Box::pin(std::future::ready(outcome))
    }

    fn release_in_background(self: Box<Self>) {
        let _ = self.store.give_back(&self.name, self.grant);
    }

    fn hold_until_expiry(self: Box<Self>) {
        if self.until.is_some() {
            return;
        }
        // A watchdog grant keeps the watchdog lease from now, as on Redis.
        let until = Instant::now().checked_add(self.store.config.watchdog_lease());
        let mut table = self.store.table();
        if let Some(e) = table.locks.get_mut(&self.name)
            && e.grant == self.grant
        {
            e.until = until;
        }
    }
}
