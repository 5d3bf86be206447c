//! [`PostgresLocks`]: session-level advisory locks on PostgreSQL, through `sqlx`.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{PgPool, Postgres};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{Closing, ConnFuture, Dialect, Granted, SqlBackend, SqlStore};
use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockKeys, LockMode, LockName};
use crate::error::LockError;
use crate::lock::LockGuard;
use crate::stores::locks::Locks;

/// The backend of [`PostgresLocks`]: session advisory locks.
pub type PostgresBackend = SqlBackend<PgStore>;

/// The guard of a [`PostgresLocks`] lock: the engine's guard on PostgreSQL.
pub type PostgresGuard = LockGuard<PostgresBackend>;

const STORE: &str = "postgres";

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
///   wait budget, so waiters queue in PostgreSQL without polling or a herd. The wait
///   runs in a transaction of its own (`SET LOCAL`): the session's own settings stay as
///   your application set them, and its `statement_timeout` does not cut the wait short.
///   [`LockError::Busy`] carries no holder lease (PostgreSQL has none): its
///   `retry_after` is the config's first backoff step.
/// - **Loss**: every [`LockConfig::watchdog_period`] the guard's session is asked
///   whether it still holds the lock (`pg_locks` rows of `pg_backend_pid()`, bounded by
///   the time left); a killed session (`pg_terminate_backend`, a restart, a broken
///   network) fires [`LockGuard::lost`], and [`LockGuard::valid_for`] counts from the
///   last check plus the watchdog lease.
/// - **Read-write locks** ([`LockOptions::read`](crate::LockOptions::read), `write`):
///   `pg_advisory_lock_shared` and `pg_advisory_lock` on the read-write lock's own key
///   (`<namespace>:{<name>}:rw` hashed); the server's queue lets no new reader past a
///   waiting writer. No downgrade: the read hold would be another session's.
/// - **Session pooling is required**: an advisory lock belongs to the server session
///   (backend) that took it. Behind a pooler in transaction or statement mode
///   (PgBouncer's `pool_mode = transaction`, ...) each statement may run on another
///   backend, so the lock, its check and its unlock would not meet: connect directly
///   or through a pooler in session mode. (There a check that lands on another
///   backend finds no lock and fires `lost()` rather than vouching for it.)
/// - **Bounded**: an acquisition ends within its wait budget plus one
///   [`LockConfig::with_command_timeout`], however long the pool would wait for a
///   connection; [`PostgresLocks::connect`]'s pool waits for one at most the config's
///   wait plus that timeout.
/// - **Fencing tokens** come from the sequence [`FENCE_SEQUENCE`], taken in the same
///   statement as the lock, so they grow with every grant in the database. It is
///   created on first use (`CREATE SEQUENCE IF NOT EXISTS`), which needs that right.
/// - **Leases** from [`Lease::Fixed`](crate::Lease::Fixed) are not applied: a session
///   lock lasts until released or until the session ends, and a max-hold does not
///   apply either. `hold_until_expiry` releases.
/// - A cancelled acquisition closes its connection instead of returning it to the pool,
///   so a lock granted after the cancellation dies with the session. On PostgreSQL 14
///   and later its backend also leaves the lock's queue within about a second (the wait
///   sets `client_connection_check_interval`), not when its `lock_timeout` runs out.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockConfig, PostgresLocks};
///
/// let pool = sqlx::PgPool::connect("postgres://app@db/app").await.map_err(|e| {
///     lock_core::LockError::Store { store: "postgres", message: e.to_string() }
/// })?;
/// let locks = PostgresLocks::new(pool, LockConfig::new())?;
/// let guard = locks.lock(("report", 2026_u32)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
pub type PostgresLocks = Locks<PostgresBackend>;

/// What PostgreSQL adds to the session-lock protocol: the pool and what the store
/// learns of its server once (the token sequence made, the wait's settings).
#[derive(Debug)]
pub struct PgStore {
    pool: PgPool,
    config: LockConfig,
    /// The statement that sets a wait's limits in its transaction (`$1`: the wait's
    /// `lock_timeout`), once the token sequence is made.
    prepared: OnceCell<&'static str>,
}

/// A wait's settings: its budget as `lock_timeout`, no `statement_timeout`.
const WAIT_SETTINGS: &str =
    "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', '0', true)";

/// The same, and a backend that polls its socket every second while it waits, so that
/// a wait whose acquisition was cancelled (its connection closed) leaves the lock's
/// queue then, not when its `lock_timeout` runs out (PostgreSQL 14 and later, on
/// Linux, macOS and the BSDs).
const WAIT_SETTINGS_CHECKED: &str = "SELECT set_config('lock_timeout', $1, true), \
     set_config('statement_timeout', '0', true), \
     set_config('client_connection_check_interval', '1000', true)";

impl Locks<PostgresBackend> {
    /// Locks on the database of `pool` (your application's pool can be shared: each
    /// held lock keeps one of its connections). Fails with
    /// [`LockError::InvalidConfig`] for a config that [`LockConfig::validate`] refuses.
    pub fn new(pool: PgPool, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        Ok(Self::build(pool, config))
    }

    /// Connects a pool to `url` (`postgres://user:password@host:port/database`).
    pub async fn connect(url: &str, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let pool = super::connect::<Postgres>(STORE, url, &config).await?;
        Ok(Self::build(pool, config))
    }

    /// Locks on `pool` with `config`, validated by the caller.
    fn build(pool: PgPool, config: LockConfig) -> Self {
        let store = PgStore {
            pool,
            config,
            prepared: OnceCell::new(),
        };
        Self::over(SqlBackend { store })
    }

    /// The pool locks are taken on.
    pub fn pool(&self) -> &PgPool {
        &self.backend().store.pool
    }

    /// The advisory lock key of `name` (as `pg_locks.classid << 32 | objid` shows it).
    pub fn advisory_key<N: LockName>(&self, name: N) -> Result<i64, LockError> {
        let config = self.config();
        let name = key::escaped_name(&config.delimiter, &name)?;
        Ok(advisory_key(&config.namespace, &name, LockMode::Exclusive))
    }
}

/// FNV-1a 64 of `<namespace>:<name>` (of a read-write lock: `<namespace>:{<name>}:rw`,
/// which no plain name hashes, a name having no braces), as a signed advisory key.
fn advisory_key(namespace: &str, name: &str, mode: LockMode) -> i64 {
    let parts: &[&str] = if mode.is_read_write() {
        &[namespace, ":{", name, "}:rw"]
    } else {
        &[namespace, ":", name]
    };
    super::fnv1a64(FNV_OFFSET, parts) as i64
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn store_error(e: sqlx::Error) -> LockError {
    super::store_error(STORE, e)
}

/// `lock_not_available`: `lock_timeout` ran out.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// The longest `lock_timeout` PostgreSQL takes.
const MAX_LOCK_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

impl PgStore {
    /// Makes the token sequence and learns whether a wait can check its connection,
    /// once per store: the statement of a wait's settings.
    async fn prepare(
        &self,
        conn: &mut PoolConnection<Postgres>,
    ) -> Result<&'static str, LockError> {
        self.prepared
            .get_or_try_init(|| async {
                let create = format!("CREATE SEQUENCE IF NOT EXISTS {FENCE_SEQUENCE}");
                match sqlx::query(&create).execute(&mut **conn).await {
                    Ok(_) => {}
                    // Two sessions creating it at once: the other one won.
                    Err(sqlx::Error::Database(e))
                        if matches!(e.code().as_deref(), Some("23505" | "42P07")) => {}
                    Err(e) => return Err(store_error(e)),
                }
                // Unknown before PostgreSQL 14, refused where the platform cannot poll
                // for a closed socket. Local to this statement's own transaction.
                let probe = "SELECT set_config('client_connection_check_interval', '1000', true)";
                let checked = match sqlx::query(probe).execute(&mut **conn).await {
                    Ok(_) => true,
                    // Unknown setting, or a value refused: what this server is. Any
                    // other error (a cancel, a shutdown) is asked again next time.
                    Err(sqlx::Error::Database(e))
                        if matches!(e.code().as_deref(), Some("42704" | "22023")) =>
                    {
                        false
                    }
                    Err(e) => return Err(store_error(e)),
                };
                Ok(if checked {
                    WAIT_SETTINGS_CHECKED
                } else {
                    WAIT_SETTINGS
                })
            })
            .await
            .copied()
    }
}

impl SqlStore for PgStore {
    type Dialect = Advisory;

    fn config(&self) -> &LockConfig {
        &self.config
    }

    const SHARED: bool = true;

    fn target(&self, keys: &LockKeys) -> Advisory {
        Advisory {
            key: advisory_key(&self.config.namespace, keys.name(), keys.mode),
            shared: keys.mode == LockMode::Read,
        }
    }

    async fn grant(
        &self,
        target: &Advisory,
        wait: Duration,
    ) -> Result<Option<Granted<Advisory>>, LockError> {
        let started = Instant::now();
        let (key, shared) = (target.key, if target.shared { "_shared" } else { "" });
        // Until the answer is in, a cancellation or a failure must not give this session
        // back to the pool: it may hold the lock.
        let mut pending = Closing::new(self.pool.acquire().await.map_err(store_error)?);
        let conn = pending.get();
        let wait_settings = self.prepare(conn).await?;
        let token: Option<i64> = if wait.is_zero() {
            sqlx::query_scalar(&format!(
                "SELECT CASE WHEN pg_try_advisory_lock{shared}($1) \
                 THEN nextval('{FENCE_SEQUENCE}') END"
            ))
            .bind(key)
            .fetch_one(&mut **conn)
            .await
            .map_err(store_error)?
        } else {
            // `lock_timeout` holds at most 2^31 - 1 ms (about 24.8 days): a longer budget
            // is waited in steps of that (the engine tries a busy answer again until its
            // deadline).
            let left = wait
                .saturating_sub(started.elapsed())
                .clamp(Duration::from_millis(1), MAX_LOCK_TIMEOUT);
            // In a transaction of its own, so that `SET LOCAL` leaves the session's own
            // settings as they were (the pool hands it on): the wait's `lock_timeout` is
            // the budget, and the application's `statement_timeout`, if any, does not cut
            // it short. The advisory lock is the session's: it outlives the transaction.
            sqlx::query("BEGIN")
                .execute(&mut **conn)
                .await
                .map_err(store_error)?;
            sqlx::query(wait_settings)
                .bind(format!("{}ms", left.as_millis()))
                .execute(&mut **conn)
                .await
                .map_err(store_error)?;
            let got = sqlx::query_scalar(&format!(
                "SELECT nextval('{FENCE_SEQUENCE}') FROM (SELECT pg_advisory_lock{shared}($1)) AS l"
            ))
            .bind(key)
            .fetch_one(&mut **conn)
            .await;
            match got {
                Ok(token) => {
                    sqlx::query("COMMIT")
                        .execute(&mut **conn)
                        .await
                        .map_err(store_error)?;
                    Some(token)
                }
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(LOCK_NOT_AVAILABLE) =>
                {
                    // The time ran out in the lock's wait, or in a wait after it was
                    // taken (for the sequence, which DDL may hold): the session gives
                    // back whatever it got before it may be pooled again.
                    let rolled_back = sqlx::query("ROLLBACK").execute(&mut **conn).await;
                    if rolled_back.is_ok() && target.unlock(conn).await.is_ok() {
                        drop(pending.keep());
                    }
                    return Ok(None);
                }
                Err(e) => return Err(store_error(e)),
            }
        };
        let Some(token) = token else {
            // Refused at once: the session holds nothing and may be pooled again.
            drop(pending.keep());
            return Ok(None);
        };
        let token = u64::try_from(token).unwrap_or_default();
        Ok(Some((token, pending)))
    }
}

/// Session advisory locks on one 64-bit key.
pub(crate) struct Advisory {
    key: i64,
    /// A read hold (`pg_advisory_lock_shared`).
    shared: bool,
}

impl Dialect for Advisory {
    type Db = Postgres;
    const STORE: &'static str = STORE;
    const KIND: crate::metrics::StoreKind = crate::metrics::StoreKind::Postgres;

    fn check<'a>(&'a self, conn: &'a mut PoolConnection<Postgres>) -> ConnFuture<'a, bool> {
        // A live session is not enough: the lock must be held by this very backend (a
        // one-bigint advisory key shows as classid = high half, objid = low half,
        // objsubid = 1).
        let (high, low) = (
            i64::from((self.key >> 32) as u32),
            i64::from(self.key as u32),
        );
        Box::pin(async move {
            let held: Result<bool, _> = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks \
                 WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted \
                 AND mode = $3 AND classid::bigint = $1 \
                 AND objid::bigint = $2 AND objsubid = 1)",
            )
            .bind(high)
            .bind(low)
            .bind(if self.shared {
                "ShareLock"
            } else {
                "ExclusiveLock"
            })
            .fetch_one(&mut **conn)
            .await;
            matches!(held, Ok(true))
        })
    }

    fn unlock<'a>(
        &'a self,
        conn: &'a mut PoolConnection<Postgres>,
    ) -> ConnFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let unlock = if self.shared {
                "SELECT pg_advisory_unlock_shared($1)"
            } else {
                "SELECT pg_advisory_unlock($1)"
            };
            sqlx::query_scalar(unlock)
                .bind(self.key)
                .fetch_one(&mut **conn)
                .await
        })
    }
}
