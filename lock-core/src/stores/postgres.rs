//! [`PostgresLocks`]: session-level advisory locks on PostgreSQL, through `sqlx`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::{Mutex, OnceCell, watch};
use tokio::time::Instant;

use super::session::{BoxFuture, Hold, StoreGuard, Stores};
use crate::key::{self, LockName};
use crate::lock::Resolved;
use crate::{FencingToken, LockConfig, LockError, LockOptions};

/// The sequence fencing tokens come from (one per database, whatever the lock names).
pub const FENCE_SEQUENCE: &str = "lock_core_fence";

/// Locks on PostgreSQL: session-level advisory locks, each held on its own pooled
/// connection for the guard's life (the lock dies with the session: that is its lease).
///
/// - **Names** (`<namespace>:<name>`) are hashed to the 64-bit advisory key space
///   (FNV-1a). Two names that collide share one lock: never two owners of one name, but
///   a false wait; with n names in use the chance of any collision is about n² / 2^65
///   (10⁶ names: 3 × 10⁻⁸).
/// - **Waiting** is the server's own: `pg_advisory_lock` under `lock_timeout` set to the
///   wait budget, so waiters queue in PostgreSQL without polling or a herd.
///   [`LockError::Busy`] carries no holder lease (PostgreSQL has none): its
///   `retry_after` is the config's first backoff step.
/// - **Loss**: every [`LockConfig::watchdog_period`] the guard's connection is checked
///   (`SELECT 1`, bounded by the time left); a killed session (`pg_terminate_backend`,
///   a restart, a broken network) fires [`StoreGuard::lost`], and
///   [`StoreGuard::valid_for`] counts from the last check plus the watchdog lease.
/// - **Fencing tokens** come from the sequence [`FENCE_SEQUENCE`], taken in the same
///   statement as the lock, so they grow with every grant in the database. It is
///   created on first use (`CREATE SEQUENCE IF NOT EXISTS`), which needs that right.
/// - **Leases** from [`Lease::Fixed`](crate::Lease::Fixed) are not applied: a session
///   lock lasts until released or until the session ends. `hold_until_expiry` releases.
/// - A cancelled acquisition closes its connection instead of returning it to the pool,
///   so a lock granted after the cancellation dies with the session.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockConfig, PostgresLocks};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await.map_err(|e| {
///     lock_core::LockError::Store { store: "postgres", message: e.to_string() }
/// })?;
/// let locks = PostgresLocks::new(pool, LockConfig::new());
/// let guard = locks.lock(("report", 2026_u32)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresLocks {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: PgPool,
    config: LockConfig,
    sequence: OnceCell<()>,
    stores: Arc<Stores>,
}

impl PostgresLocks {
    /// Locks on the database of `pool` (your application's pool can be shared: each
    /// held lock keeps one of its connections).
    pub fn new(pool: PgPool, config: LockConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                pool,
                config,
                sequence: OnceCell::new(),
                stores: Arc::default(),
            }),
        }
    }

    /// Connects a pool to `url` (`postgres://user:password@host:port/database`).
    pub async fn connect(url: &str, config: LockConfig) -> Result<Self, LockError> {
        let pool = PgPool::connect(url).await.map_err(store_error)?;
        Ok(Self::new(pool, config))
    }

    /// The pool locks are taken on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The advisory lock key of `name` (as `pg_locks.classid << 32 | objid` shows it).
    pub fn advisory_key<N: LockName>(&self, name: N) -> Result<i64, LockError> {
        let name = key::escaped_name(&self.inner.config.delimiter, &name)?;
        Ok(advisory_key(&self.inner.config.namespace, &name))
    }

    /// Takes the lock if it is free (or re-enters it); [`LockError::Busy`] otherwise.
    pub async fn try_lock<N: LockName>(&self, name: N) -> Result<StoreGuard, LockError> {
        self.acquire(name, LockOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Takes the lock, waiting up to the config's wait budget.
    pub async fn lock<N: LockName>(&self, name: N) -> Result<StoreGuard, LockError> {
        self.acquire(name, LockOptions::new()).await
    }

    /// Takes the lock with per-call options (wait, scope, delimiter).
    pub async fn acquire<N: LockName>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<StoreGuard, LockError> {
        let how = Resolved::new(&self.inner.config, options)?;
        let name = key::escaped_name(how.delimiter, &name)?;
        let key = advisory_key(&self.inner.config.namespace, &name);
        let wait = how.wait;
        let inner = self.inner.clone();
        let fresh = {
            let name = name.clone();
            async move {
                let hold = inner.take(name, key, wait).await?;
                Ok(Box::new(hold) as Box<dyn Hold>)
            }
        };
        self.inner
            .stores
            .acquire(&name, how.scope.id(), fresh)
            .await
    }

    /// Grants held now (one per name and scope).
    pub fn held_count(&self) -> usize {
        self.inner.stores.held_count()
    }
}

/// FNV-1a 64 of `<namespace>:<name>`, as a signed advisory key.
fn advisory_key(namespace: &str, name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in namespace.bytes().chain([b':']).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

fn store_error(e: sqlx::Error) -> LockError {
    LockError::Store {
        store: "postgres",
        message: e.to_string(),
    }
}

/// `lock_not_available`: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";

impl Inner {
    async fn ensure_sequence(&self, conn: &mut PoolConnection<Postgres>) -> Result<(), LockError> {
        self.sequence
            .get_or_try_init(|| async {
                let create = format!("CREATE SEQUENCE IF NOT EXISTS {FENCE_SEQUENCE}");
                match sqlx::query(&create).execute(&mut **conn).await {
                    Ok(_) => Ok(()),
                    // Two sessions creating it at once: the other one won.
                    Err(sqlx::Error::Database(e))
                        if matches!(e.code().as_deref(), Some("23505" | "42P07")) =>
                    {
                        Ok(())
                    }
                    Err(e) => Err(store_error(e)),
                }
            })
            .await
            .map(|_| ())
    }

    async fn take(
        self: Arc<Self>,
        name: String,
        key: i64,
        wait: Duration,
    ) -> Result<PostgresHold, LockError> {
        let started = Instant::now();
        // Until the answer is in, a cancellation or a failure must not give this session
        // back to the pool: it may hold the lock.
        let mut pending = Closing(Some(self.pool.acquire().await.map_err(store_error)?));
        let conn = pending.get();
        self.ensure_sequence(conn).await?;
        let token: Option<i64> = if wait.is_zero() {
            sqlx::query_scalar(&format!(
                "SELECT CASE WHEN pg_try_advisory_lock($1) THEN nextval('{FENCE_SEQUENCE}') END"
            ))
            .bind(key)
            .fetch_one(&mut **conn)
            .await
            .map_err(store_error)?
        } else {
            let left = wait
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
            sqlx::query("SELECT set_config('lock_timeout', $1, false)")
                .bind(format!("{}ms", left.as_millis()))
                .execute(&mut **conn)
                .await
                .map_err(store_error)?;
            let got = sqlx::query_scalar(&format!(
                "SELECT nextval('{FENCE_SEQUENCE}') FROM (SELECT pg_advisory_lock($1)) AS l"
            ))
            .bind(key)
            .fetch_one(&mut **conn)
            .await;
            match got {
                Ok(token) => Some(token),
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                {
                    let _ = sqlx::query("SELECT set_config('lock_timeout', '0', false)")
                        .execute(&mut **conn)
                        .await;
                    return Err(LockError::Timeout {
                        key: name,
                        waited: started.elapsed(),
                    });
                }
                Err(e) => return Err(store_error(e)),
            }
        };
        let Some(token) = token else {
            return Err(LockError::Busy {
                key: name,
                retry_after: self.config.backoff.initial,
            });
        };
        let token = u64::try_from(token).unwrap_or_default();
        Ok(PostgresHold::start(self, name, key, token, pending.keep()))
    }
}

/// A pooled connection that is closed, not returned to the pool, when dropped before
/// [`keep`](Self::keep): its session may hold a lock nobody knows of.
struct Closing(Option<PoolConnection<Postgres>>);

impl Closing {
    fn get(&mut self) -> &mut PoolConnection<Postgres> {
        self.0
            .as_mut()
            .expect("a Closing connection is only emptied by keep()")
    }

    fn keep(mut self) -> PoolConnection<Postgres> {
        self.0
            .take()
            .expect("a Closing connection is only emptied by keep()")
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            c.close_on_drop();
        }
    }
}

/// One advisory lock held on its session, and the task checking that session.
struct PostgresHold {
    name: String,
    key: i64,
    token: u64,
    conn: Arc<Mutex<Option<PoolConnection<Postgres>>>>,
    /// Until when the session is known alive (`None` once lost).
    alive: watch::Receiver<Option<Instant>>,
    monitor: tokio::task::JoinHandle<()>,
}

impl PostgresHold {
    fn start(
        store: Arc<Inner>,
        name: String,
        key: i64,
        token: u64,
        conn: PoolConnection<Postgres>,
    ) -> Self {
        let lease = store.config.watchdog_lease();
        let period = store.config.watchdog_period();
        let (tx, alive) = watch::channel(Some(Instant::now() + lease));
        let conn = Arc::new(Mutex::new(Some(conn)));
        let checked = conn.clone();
        let lock = name.clone();
        let monitor = tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let sent = Instant::now();
                let Some(until) = *tx.borrow() else { return };
                let check = async {
                    let mut conn = checked.lock().await;
                    match conn.as_mut() {
                        Some(c) => sqlx::query("SELECT 1").execute(&mut **c).await.is_ok(),
                        None => false,
                    }
                };
                let ok = tokio::time::timeout_at(until, check).await.unwrap_or(false);
                if ok {
                    tx.send_replace(Some(sent + lease));
                } else {
                    tracing::warn!(lock = %lock, "lock lost: its PostgreSQL session stopped answering");
                    tx.send_replace(None);
                    return;
                }
            }
        });
        Self {
            name,
            key,
            token,
            conn,
            alive,
            monitor,
        }
    }
}

impl Drop for PostgresHold {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

impl Hold for PostgresHold {
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
        let (conn, key, name) = (self.conn.clone(), self.key, self.name.clone());
        let lost = self.alive.borrow().is_none();
        Box::pin(async move {
            let mut slot = conn.lock().await;
            let Some(c) = slot.take() else {
                return Err(LockError::Expired { key: name });
            };
            // Closed rather than pooled unless the unlock is confirmed.
            let mut c = Closing(Some(c));
            let unlocked: Result<bool, _> = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                .bind(key)
                .fetch_one(&mut **c.get())
                .await;
            match unlocked {
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
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime: dropping the connection closes the session, which frees the
            // lock on the server.
            if let Ok(mut slot) = self.conn.try_lock() {
                drop(Closing(slot.take()));
            }
            return;
        };
        let name = self.name.clone();
        crate::cleanup::spawn(&runtime, "releasing a PostgreSQL lock", name, async move {
            self.release().await
        });
    }
}
