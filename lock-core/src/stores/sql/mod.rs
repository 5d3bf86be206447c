//! What the database stores share: the engine's backend for session locks
//! ([`SqlBackend`]): a lock held by one pooled session for the grant's life, checked by
//! the engine's watchdog every period, and the rule that a session whose state is
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
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::client::cleanup;
use crate::client::config::{LockConfig, MAX_LEASE};
use crate::client::store::key::LockKeys;
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::lock::Request;
use crate::lock::registry::Loss;
use crate::lock::seam::{Backend, Capabilities, Held, Renewed, Seam, Taken, Validity};
use crate::metrics::StoreKind;
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
    within(store, limit, take, || {
        format!(
            "no connection or no answer within the wait budget ({wait:?}) plus the command \
             timeout ({:?}): is the server up and reachable, and does the pool have a free \
             connection?",
            config.command_timeout
        )
    })
    .await
}

/// Runs `call` within `limit`; past it, a [`LockError::Store`] whose message `missed`
/// says what did not happen. Cut short, `call` is dropped (a session it held is closed).
async fn within<T>(
    store: &'static str,
    limit: Duration,
    call: impl Future<Output = Result<T, LockError>>,
    missed: impl FnOnce() -> String,
) -> Result<T, LockError> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(LockError::Store {
            store,
            message: missed(),
        })
    })
}

/// A pool for `url` that waits for a connection as long as an acquisition with the
/// config's wait may, connected within one command timeout.
pub(crate) async fn connect<DB: Database>(
    store: &'static str,
    url: &str,
    config: &LockConfig,
) -> Result<Pool<DB>, LockError> {
    // A wait meant as "never" (`Duration::MAX`) is bounded as the engine bounds it: the
    // pool adds its timeout to the clock.
    let options = PoolOptions::<DB>::new().acquire_timeout(
        config
            .wait
            .min(MAX_LEASE)
            .saturating_add(config.command_timeout),
    );
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
        let Some(mut c) = self.0.take() else {
            return;
        };
        c.close_on_drop();
        // sqlx closes it on a task it spawns, which panics on a thread with no runtime
        // (a future dropped there): on such a thread, on the background runtime.
        if let Err(unclosed) = cleanup::in_runtime(move || drop(c)) {
            tracing::error!("lock-core: no runtime to close a database session on; it stays open");
            std::mem::forget(unclosed);
        }
    }
}

/// One session lock: the pooled connection whose session holds it (its token goes to
/// the engine with the grant).
/// Dropped with the connection still in it (a grant nobody gave back), the
/// connection is closed, which frees the lock in the server.
pub(crate) struct Session<D: Dialect> {
    dialect: D,
    /// Closed, never pooled, if dropped here: a release cut short while it waits for
    /// the session must not hand a session that holds the lock back to the pool.
    conn: Mutex<Option<Closing<D::Db>>>,
}

/// Gives the lock of `session` back: `Ok` if the session still held it. The
/// connection goes back to the pool only when the unlock is confirmed.
async fn unlock<D: Dialect>(session: &Session<D>) -> Held {
    let mut slot = session.conn.lock().await;
    let Some(mut c) = slot.take() else {
        return Err(Loss::Expired);
    };
    match session.dialect.unlock(c.get()).await {
        Ok(true) => {
            drop(c.keep());
            Ok(())
        }
        // The session no longer held it, or is gone (closed now): the lock was lost.
        Ok(false) | Err(_) => Err(Loss::Expired),
    }
}

/// Asks the session of `session` whether it still holds its lock, within `within`:
/// a session check is this store's renewal, proving the lock until `sent + lease`.
async fn check<D: Dialect>(
    session: &Session<D>,
    lease: Duration,
    within: Duration,
) -> Held<Instant> {
    let sent = Instant::now();
    let asked = async {
        let mut conn = session.conn.lock().await;
        match conn.as_mut() {
            Some(c) => session.dialect.check(c.get()).await,
            None => false,
        }
    };
    match tokio::time::timeout(within, asked).await {
        Ok(true) => Ok(sent + lease),
        // Not held, or no answer in time: a session store cannot tell those apart
        // from a killed session, so the lock counts as lost.
        _ => Err(Loss::Expired),
    }
}

/// A lock taken in the server: its token and the connection whose session holds it
/// (closed, never pooled, if dropped before it is given back).
pub(crate) type Granted<D> = (u64, Closing<<D as Dialect>::Db>);

/// What one database adds to the shared session-lock protocol: where a lock lives,
/// and how to take it once.
pub(crate) trait SqlStore: Send + Sync + 'static {
    /// The lock's target in the server (an advisory key, a `GET_LOCK` name), which
    /// checks and unlocks it.
    type Dialect: Dialect;

    /// Whether it takes read and write holds.
    const SHARED: bool;

    fn config(&self) -> &LockConfig;

    /// The target of the lock `keys` (its escaped name and kind of hold) in the
    /// config's namespace.
    fn target(&self, keys: &LockKeys) -> Self::Dialect;

    /// Takes `target` once, waiting in the server up to `wait`: its token and the
    /// connection whose session holds it, or `None` if busy. Cancelled or failed, the
    /// connection is closed, never pooled.
    fn grant(
        &self,
        target: &Self::Dialect,
        wait: Duration,
    ) -> impl Future<Output = Result<Option<Granted<Self::Dialect>>, LockError>> + Send;
}

/// Session locks on a database (PostgreSQL advisory locks, MySQL `GET_LOCK`): the
/// backend of [`PostgresLocks`](crate::PostgresLocks) and
/// [`MysqlLocks`](crate::MysqlLocks). A grant lives as long as its session: no fixed
/// lease, and the watchdog checks every grant's session each period.
pub struct SqlBackend<S> {
    pub(crate) store: S,
}

impl<S> std::fmt::Debug for SqlBackend<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlBackend").finish_non_exhaustive()
    }
}

#[allow(private_bounds)] // sealed: the stores of this crate
impl<S: SqlStore> Backend for SqlBackend<S> {}

impl<S: SqlStore> Seam for SqlBackend<S> {
    type Grant = Arc<Session<S::Dialect>>;

    fn kind(&self) -> StoreKind {
        <S::Dialect as Dialect>::KIND
    }

    fn config(&self) -> &LockConfig {
        self.store.config()
    }

    // A session holds its own read and write holds: a writer's read hold would be
    // another session's, waiting for the writer.
    const CAPABILITIES: Capabilities = if S::SHARED {
        Capabilities::CHECKED_SESSIONS.with_shared(false)
    } else {
        Capabilities::CHECKED_SESSIONS
    };

    async fn take(
        &self,
        req: &Request,
        _seq: u64,
        deadline: Instant,
    ) -> Result<Taken<Self::Grant>, LockError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let config = self.store.config();
        let dialect = self.store.target(&req.keys);
        let store = <S::Dialect as Dialect>::STORE;
        let granted = bounded(store, wait, config, self.store.grant(&dialect, wait)).await?;
        let Some((token, conn)) = granted else {
            return Ok(Taken::busy_without_lease(config));
        };
        Ok(Taken::Granted {
            grant: Arc::new(Session {
                dialect,
                conn: Mutex::new(Some(conn)),
            }),
            token: Some(FencingToken::new(token, token)),
            valid: Validity::Until(Instant::now() + config.watchdog_lease()),
        })
    }

    async fn give_back(&self, keys: &LockKeys, grant: &Self::Grant) -> Result<Held, LockError> {
        // Cut short, `unlock` drops the session's connection unconfirmed: it is closed,
        // and the server frees the lock once it sees that.
        let limit = self.store.config().command_timeout;
        let store = <S::Dialect as Dialect>::STORE;
        let given = within(store, limit, async { Ok(unlock(grant).await) }, || {
            format!(
                "no answer to the unlock within the command timeout ({limit:?}): its session \
                 is closed, and the server frees the lock once it sees that"
            )
        })
        .await;
        if given.is_err() {
            // Cut short while a session check held the connection (it may, for as long
            // as the lease it proves): close it once that check lets go, or a grant
            // kept alive elsewhere (a `lost()` future) would keep the lock held.
            let session = grant.clone();
            cleanup::spawn(
                "closing a released session",
                keys.name().to_owned(),
                async move {
                    drop(session.conn.lock().await.take());
                    Ok(())
                },
            );
        }
        given
    }

    async fn extend(
        &self,
        _keys: &LockKeys,
        grant: &Self::Grant,
        _lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        // A check proves the session's hold for one watchdog lease, whatever was asked.
        let config = self.store.config();
        Ok(check(grant, config.watchdog_lease(), config.command_timeout).await)
    }

    async fn renew(
        &self,
        grants: &[(&LockKeys, &Self::Grant)],
        lease: Duration,
        within: Duration,
    ) -> Result<Vec<Renewed>, LockError> {
        let checks = grants
            .iter()
            .map(|(_, session)| async move { Ok(check(session, lease, within).await) });
        Ok(futures_util::future::join_all(checks).await)
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, _channel: &'a str) -> Option<Listen<'a>> {
        // Waiters wait inside the server, in `take`.
        None
    }
}
