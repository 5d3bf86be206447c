//! What the database stores share: a lock held by one pooled session for the guard's
//! life, a task that checks that session, and the rule that a session whose state is
//! unknown is closed, never pooled.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{Database, Pool};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use super::session::{BoxFuture, Hold};
use crate::client::config::LockConfig;
use crate::error::LockError;
use crate::metrics::{self, Renewal, StoreKind};
use crate::owner::FencingToken;

/// A future borrowing a session.
pub(crate) type ConnFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How one database holds, checks and gives back a session lock.
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The database.
    type Db: Database;
    /// The store's name in errors and logs.
    const STORE: &'static str;
    /// The store's `store` label in metrics.
    const KIND: StoreKind;
    /// Whether the session still holds the lock (an error counts as no).
    fn check<'a>(&'a self, conn: &'a mut PoolConnection<Self::Db>) -> ConnFuture<'a, bool>;
    /// Gives the lock back: `true` if the session held it.
    fn unlock<'a>(
        &'a self,
        conn: &'a mut PoolConnection<Self::Db>,
    ) -> ConnFuture<'a, Result<bool, sqlx::Error>>;
}

/// FNV-1a 64 over `parts` from `offset` (the standard offset basis is
/// `0xcbf2_9ce4_8422_2325`): stable across processes, versions and languages.
pub(crate) fn fnv1a64(offset: u64, parts: &[&str]) -> u64 {
    let mut h = offset;
    for b in parts.iter().flat_map(|p| p.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// A database error as a [`LockError::Store`].
pub(crate) fn store_error(store: &'static str, e: sqlx::Error) -> LockError {
    LockError::Store {
        store,
        message: e.to_string(),
    }
}

/// Runs the acquisition `take` within its wait budget plus one command timeout,
/// whatever the pool or the network does (a pool waits 30 s for a connection by
/// default). Cut short, `take` drops its [`Closing`] session: a lock granted meanwhile
/// dies with it.
pub(crate) async fn bounded<T>(
    store: &'static str,
    wait: Duration,
    config: &LockConfig,
    take: impl Future<Output = Result<T, LockError>>,
) -> Result<T, LockError> {
    let limit = wait.saturating_add(config.command_timeout);
    match tokio::time::timeout(limit, take).await {
        Ok(taken) => taken,
        Err(_) => Err(LockError::Store {
            store,
            message: format!(
                "no connection or no answer within the wait budget ({wait:?}) plus the \
                 command timeout ({:?}): is the server up and reachable, and does the \
                 pool have a free connection?",
                config.command_timeout
            ),
        }),
    }
}

/// A pool for `url` that waits for a connection as long as an acquisition with the
/// config's wait may, connected within one command timeout.
pub(crate) async fn connect<DB: Database>(
    store: &'static str,
    url: &str,
    config: &LockConfig,
) -> Result<Pool<DB>, LockError> {
    let options = PoolOptions::<DB>::new()
        .acquire_timeout(config.wait.saturating_add(config.command_timeout));
    match tokio::time::timeout(config.command_timeout, options.connect(url)).await {
        Ok(pool) => pool.map_err(|e| store_error(store, e)),
        Err(_) => Err(LockError::Store {
            store,
            message: format!(
                "no connection within the command timeout ({:?}): is the server up and \
                 reachable?",
                config.command_timeout
            ),
        }),
    }
}

/// A pooled connection that is closed, not returned to the pool, when dropped before
/// [`keep`](Self::keep): its session may hold a lock nobody knows of.
pub(crate) struct Closing<DB: Database>(Option<PoolConnection<DB>>);

impl<DB: Database> Closing<DB> {
    pub(crate) fn new(conn: PoolConnection<DB>) -> Self {
        Self(Some(conn))
    }

    pub(crate) fn get(&mut self) -> &mut PoolConnection<DB> {
        // Only `keep` (which consumes self) empties it.
        self.0
            .as_mut()
            .expect("a Closing connection is only emptied by keep()")
    }

    pub(crate) fn keep(mut self) -> PoolConnection<DB> {
        self.0
            .take()
            .expect("a Closing connection is only emptied by keep()")
    }
}

impl<DB: Database> Drop for Closing<DB> {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.close_on_drop();
        }
    }
}

/// One session lock and the task checking its session every watchdog period: a
/// failed or late check fires `lost()`; `valid_for` runs from the last good check
/// plus the watchdog lease.
pub(crate) struct SqlHold<D: Dialect> {
    dialect: Arc<D>,
    name: String,
    token: u64,
    /// Closed, never pooled, if dropped here: a release cut short while it waits for
    /// the session must not hand a session that holds the lock back to the pool.
    conn: Arc<Mutex<Option<Closing<D::Db>>>>,
    /// Until when the session is known to hold the lock (`None` once lost).
    alive: watch::Receiver<Option<Instant>>,
    monitor: tokio::task::JoinHandle<()>,
}

impl<D: Dialect> SqlHold<D> {
    pub(crate) fn start(
        dialect: D,
        config: &LockConfig,
        name: String,
        token: u64,
        conn: PoolConnection<D::Db>,
    ) -> Self {
        let dialect = Arc::new(dialect);
        let lease = config.watchdog_lease();
        let period = config.watchdog_period();
        let (tx, alive) = watch::channel(Some(Instant::now() + lease));
        let conn = Arc::new(Mutex::new(Some(Closing::new(conn))));
        let (checked, checker, lock) = (conn.clone(), dialect.clone(), name.clone());
        let monitor = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let sent = Instant::now();
                let Some(until) = *tx.borrow() else { return };
                let check = async {
                    let mut conn = checked.lock().await;
                    match conn.as_mut() {
                        Some(c) => checker.check(c.get()).await,
                        None => false,
                    }
                };
                // A session check is this store's renewal: it extends what the guard
                // may count on.
                let checked = tokio::time::timeout_at(until, check).await;
                metrics::renewal_call(D::KIND, sent.elapsed());
                let renewal = match checked {
                    Ok(true) => Renewal::Renewed,
                    Ok(false) => Renewal::Expired,
                    Err(_) => Renewal::Error,
                };
                metrics::renewed(D::KIND, renewal, 1);
                if renewal == Renewal::Renewed {
                    tx.send_replace(Some(sent + lease));
                } else {
                    tracing::warn!(lock = %lock, store = D::STORE, "lock lost: its session no longer holds it or stopped answering");
                    tx.send_replace(None);
                    metrics::lost(D::KIND);
                    return;
                }
            }
        });
        Self {
            dialect,
            name,
            token,
            conn,
            alive,
            monitor,
        }
    }
}

impl<D: Dialect> Drop for SqlHold<D> {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

impl<D: Dialect> Hold for SqlHold<D> {
    fn valid_for(&self) -> Duration {
        match *self.alive.borrow() {
            Some(until) => until.saturating_duration_since(Instant::now()),
            None => Duration::ZERO,
        }
    }

    fn token(&self) -> Option<FencingToken> {
        Some(FencingToken::new(self.token, self.token))
    }

    fn lost(&self) -> BoxFuture<()> {
        let mut alive = self.alive.clone();
        Box::pin(async move {
            // A closed channel (the hold is gone) also ends the wait.
            let _ = alive.wait_for(Option::is_none).await;
        })
    }

    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>> {
        self.monitor.abort();
        let (conn, dialect, name) = (self.conn.clone(), self.dialect.clone(), self.name.clone());
        let lost = self.alive.borrow().is_none();
        Box::pin(async move {
            let mut slot = conn.lock().await;
            // Closed rather than pooled unless the unlock is confirmed.
            let Some(mut c) = slot.take() else {
                return Err(LockError::Expired { key: name });
            };
            match dialect.unlock(c.get()).await {
                Ok(true) => {
                    drop(c.keep());
                    if lost {
                        Err(LockError::Expired { key: name })
                    } else {
                        Ok(())
                    }
                }
                // The session no longer held it, or is gone: the lock was lost.
                Ok(false) | Err(_) => Err(LockError::Expired { key: name }),
            }
        })
    }

    fn release_in_background(self: Box<Self>) {
        let name = self.name.clone();
        crate::client::cleanup::spawn("releasing a database lock", name, async move {
            self.release().await
        });
    }
}
