//! [`MysqlLocks`]: `GET_LOCK` named locks on MySQL or MariaDB, through `sqlx`.

use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlPool};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::{Closing, ConnFuture, Dialect, Granted, SqlBackend, SqlStore, fnv1a64};
use crate::client::cleanup::{self, OnDrop};
use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockKeys, LockName};
use crate::error::LockError;
use crate::lock::LockGuard;
use crate::stores::locks::Locks;

/// The backend of [`MysqlLocks`]: `GET_LOCK` named locks.
pub type MysqlBackend = SqlBackend<MysqlStore>;

/// The guard of a [`MysqlLocks`] lock: the engine's guard on MySQL or MariaDB.
pub type MysqlGuard = LockGuard<MysqlBackend>;

const STORE: &str = "mysql";

/// The one-row table fencing tokens come from (one counter per database).
pub const FENCE_TABLE: &str = "lock_core_fence";

/// Longest lock name MySQL accepts in `GET_LOCK`; longer names are hashed.
pub(crate) const MAX_SERVER_NAME: usize = 64;

/// Locks on MySQL or MariaDB: `GET_LOCK` named locks, each held on its own pooled
/// connection for the guard's life (the lock dies with the session: that is its lease).
///
/// - **Names** are `<namespace>:<name>`, sent in a form no server folds together:
///   lowercase ASCII letters, digits and punctuation are kept, an uppercase letter
///   becomes `^` and the letter in lowercase, and any other character (`%`, `^`, `#`,
///   whitespace, non-ASCII) `%` and its UTF-8 bytes in lowercase hex. MySQL and MariaDB
///   document lock names as case-insensitive, so `Order` and `order` would otherwise
///   share a lock on some servers; here they are `lock:^order` and `lock:order` on
///   every server. Names longer than the server's limit of 64 characters in that form
///   become `<namespace>:#` followed by 32 hex digits of two FNV-1a 64 hashes of the
///   full name (a collision, about n² / 2^129 for n long names, would mean a false
///   wait, never two owners); no shorter name is sent with a `#`, so none can equal a
///   hashed one. [`MysqlLocks::server_name`] shows what is sent.
/// - **Waiting** is the server's own: `GET_LOCK(name, wait)` with the wait budget as its
///   timeout, so waiters queue in the server (on MariaDB under `SET STATEMENT
///   max_statement_time = 0 FOR`, so a limit the application sets on its sessions does
///   not cut the wait short). [`LockError::Busy`] carries no holder
///   lease (MySQL has none): its `retry_after` is the config's first backoff step.
/// - **Loss**: every [`LockConfig::watchdog_period`] the guard's session is asked
///   whether it still holds the lock (`IS_USED_LOCK(name) = CONNECTION_ID()`, bounded
///   by the time left); a killed connection (`KILL`, a restart, a broken network) fires
///   [`LockGuard::lost`], and [`LockGuard::valid_for`] counts from the last check
///   plus the watchdog lease.
/// - **Fencing tokens** come from one counter row in [`FENCE_TABLE`]
///   (`UPDATE ... SET n = LAST_INSERT_ID(n + 1)`) taken right after the grant, so they
///   grow with every grant in the database (one row, not one per name). The table is
///   created on first use (`CREATE TABLE IF NOT EXISTS`), which needs that right; every
///   grant in the database updates that one row, and commits the update at once where
///   sessions start with `autocommit = 0`.
/// - **Leases** from [`Lease::Fixed`](crate::Lease::Fixed) are not applied: a session
///   lock lasts until released or until the session ends, and a max-hold does not
///   apply either. `hold_until_expiry` releases.
/// - A cancelled acquisition closes its connection instead of returning it to the pool,
///   so a lock granted after the cancellation dies with the session. A wait in
///   `GET_LOCK` does not notice a closed connection, so a cancelled wait's session is
///   ended with `KILL` from another of the pool's connections (a user may always end its
///   own sessions): it leaves the lock's queue then, not at its own timeout. That is
///   why the first try asks for the session's id along with the lock. Only a session
///   still waiting in `GET_LOCK` under that id is ended, and none after its wait failed
///   (a restarted server gives ids out again from 1).
/// - **Bounded**: an acquisition ends within its wait budget plus one
///   [`LockConfig::with_command_timeout`], however long the pool would wait for a
///   connection; [`MysqlLocks::connect`]'s pool waits for one at most the config's
///   wait plus that timeout.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockConfig, MysqlLocks};
///
/// let locks = MysqlLocks::connect("mysql://app:secret@db/app", LockConfig::new()).await?;
/// let guard = locks.lock(("report", 2026_u32)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
pub type MysqlLocks = Locks<MysqlBackend>;

/// What MySQL adds to the session-lock protocol: the pool and the token counter.
#[derive(Debug)]
pub struct MysqlStore {
    pool: MySqlPool,
    config: LockConfig,
    /// What this server is sent, learned once the counter table is made.
    prepared: OnceCell<Prepared>,
}

/// The first try, which waits for nothing: the lock if it is free, and the session's
/// id, which a wait that follows needs (to be stopped if it is cancelled).
const TRY_GET_LOCK: &str = "SELECT GET_LOCK(?, 0), CAST(CONNECTION_ID() AS UNSIGNED)";

/// `GET_LOCK`, as MySQL is sent it.
const GET_LOCK: &str = "SELECT GET_LOCK(?, ?)";

/// `GET_LOCK`, as MariaDB is sent it: an application's `max_statement_time` on the
/// pool's sessions would cut the wait short (the wait has its own budget).
const GET_LOCK_MARIADB: &str = "SET STATEMENT max_statement_time = 0 FOR SELECT GET_LOCK(?, ?)";

fn store_error(e: sqlx::Error) -> LockError {
    super::store_error(STORE, e)
}

impl Locks<MysqlBackend> {
    /// Locks on the database of `pool` (your application's pool can be shared: each
    /// held lock keeps one of its connections). Fails with
    /// [`LockError::InvalidConfig`] for a config that [`LockConfig::validate`] refuses.
    pub fn new(pool: MySqlPool, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        Ok(Self::build(pool, config))
    }

    /// Connects a pool to `url` (`mysql://user:password@host:port/database`).
    pub async fn connect(url: &str, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let pool = super::connect::<MySql>(STORE, url, &config).await?;
        Ok(Self::build(pool, config))
    }

    /// Locks on `pool` with `config`, validated by the caller.
    fn build(pool: MySqlPool, config: LockConfig) -> Self {
        let store = MysqlStore {
            pool,
            config,
            prepared: OnceCell::new(),
        };
        Self::over(SqlBackend { store })
    }

    /// The pool locks are taken on.
    pub fn pool(&self) -> &MySqlPool {
        &self.backend().store.pool
    }

    /// The name `GET_LOCK` is given for the lock `name`.
    pub fn server_name<N: LockName>(&self, name: N) -> Result<String, LockError> {
        let config = self.config();
        let name = key::escaped_name(&config.delimiter, &name)?;
        Ok(server_name(&config.namespace, &name))
    }
}

fn server_name(namespace: &str, name: &str) -> String {
    let full = format!("{namespace}:{name}");
    let sent = fold_proof(&full);
    if sent.len() <= MAX_SERVER_NAME {
        return sent;
    }
    let a = fnv1a64(0xcbf2_9ce4_8422_2325, &[&full]);
    let b = fnv1a64(0x8422_2325_cbf2_9ce4, &[&full]);
    // The namespace part is cut so the whole stays within the limit (32 hex + 2).
    let ns: String = namespace.chars().take(MAX_SERVER_NAME - 34).collect();
    format!("{ns}:#{a:016x}{b:016x}")
}

/// `text` in characters no collation folds together, one to one: lowercase ASCII
/// letters, digits and punctuation as they are, `A`-`Z` as `^a`-`^z`, anything else
/// (`%`, `^`, `#` included, so no escape is forged and no `#` is sent) as `%xx` per
/// UTF-8 byte. Names that were already of the kept characters are sent unchanged.
fn fold_proof(text: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_uppercase() {
            out.push('^');
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_lowercase()
            || c.is_ascii_digit()
            || (c.is_ascii_punctuation() && !matches!(c, '%' | '^' | '#'))
        {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02x}");
            }
        }
    }
    out
}

impl MysqlStore {
    /// Makes the counter table if need be and tells MariaDB from MySQL, once per store:
    /// the `GET_LOCK` statement to send, and whether the counter's update must be
    /// committed (sessions that start with `autocommit = 0`, set on the server or by the
    /// pool's `after_connect`: left open, that transaction would lock the counter's row
    /// for every other acquisition).
    async fn prepare(&self, conn: &mut PoolConnection<MySql>) -> Result<Prepared, LockError> {
        self.prepared
            .get_or_try_init(|| async {
                let create = format!(
                    "CREATE TABLE IF NOT EXISTS {FENCE_TABLE} \
                     (id TINYINT PRIMARY KEY, n BIGINT UNSIGNED NOT NULL) ENGINE=InnoDB"
                );
                sqlx::query(&create)
                    .execute(&mut **conn)
                    .await
                    .map_err(store_error)?;
                sqlx::query(&format!("INSERT IGNORE INTO {FENCE_TABLE} VALUES (1, 0)"))
                    .execute(&mut **conn)
                    .await
                    .map_err(store_error)?;
                let (version, autocommit): (String, i64) =
                    sqlx::query_as("SELECT VERSION(), @@autocommit")
                        .fetch_one(&mut **conn)
                        .await
                        .map_err(store_error)?;
                let commit = autocommit == 0;
                if commit {
                    commit_on(conn).await?;
                }
                let get_lock = if version.contains("MariaDB") {
                    GET_LOCK_MARIADB
                } else {
                    GET_LOCK
                };
                Ok(Prepared { get_lock, commit })
            })
            .await
            .copied()
    }
}

/// What a store learns of its server once.
#[derive(Debug, Clone, Copy)]
struct Prepared {
    get_lock: &'static str,
    commit: bool,
}

async fn commit_on(conn: &mut PoolConnection<MySql>) -> Result<(), LockError> {
    sqlx::query("COMMIT")
        .execute(&mut **conn)
        .await
        .map(drop)
        .map_err(store_error)
}

impl SqlStore for MysqlStore {
    type Dialect = NamedLock;

    fn config(&self) -> &LockConfig {
        &self.config
    }

    // `GET_LOCK` has no shared mode: a shared hold built beside it (a table of
    // readers) would not be a session lock the server frees with the session.
    const SHARED: bool = false;

    fn target(&self, keys: &LockKeys) -> NamedLock {
        NamedLock {
            name: server_name(&self.config.namespace, keys.name()),
        }
    }

    async fn grant(
        &self,
        target: &NamedLock,
        wait: Duration,
    ) -> Result<Option<Granted<NamedLock>>, LockError> {
        let started = Instant::now();
        let sent = &target.name;
        // Until the answer is in, a cancellation or a failure must not give this session
        // back to the pool: it may hold the lock.
        let mut pending = Closing::new(self.pool.acquire().await.map_err(store_error)?);
        let conn = pending.get();
        let prepared = self.prepare(conn).await?;
        // 1: granted, 0: timed out, NULL: an error (the server logs it).
        let (mut got, id): (Option<i64>, u64) = sqlx::query_as(TRY_GET_LOCK)
            .bind(sent)
            .fetch_one(&mut **conn)
            .await
            .map_err(store_error)?;
        let left = wait.saturating_sub(started.elapsed());
        if got == Some(0) && !left.is_zero() {
            // Closing the connection does not end a wait in `GET_LOCK`: cut short here,
            // the session is stopped from another connection, or it would stay in the
            // lock's queue until its own timeout.
            let stop =
                OnDrop::new(|| stop_wait(self.pool.clone(), id, self.config.command_timeout));
            let waited = sqlx::query_scalar(prepared.get_lock)
                .bind(sent)
                .bind(left.as_secs_f64())
                .fetch_one(&mut **conn)
                .await;
            // Answered or failed, the wait is over: a session whose connection failed
            // may have died with its server, whose next life gives its id to another.
            stop.disarm();
            got = waited.map_err(store_error)?;
        }
        match got {
            Some(1) => {}
            Some(_) => {
                // It holds nothing: it may be pooled again.
                drop(pending.keep());
                return Ok(None);
            }
            None => {
                return Err(LockError::Store {
                    store: STORE,
                    message: format!("GET_LOCK({sent:?}) returned NULL (a server error)"),
                });
            }
        }
        let counted = sqlx::query(&format!(
            "UPDATE {FENCE_TABLE} SET n = LAST_INSERT_ID(n + 1) WHERE id = 1"
        ))
        .execute(&mut **conn)
        .await
        .map_err(store_error)?;
        if prepared.commit {
            commit_on(conn).await?;
        }
        Ok(Some((counted.last_insert_id(), pending)))
    }
}

/// Ends the session `id`, whose wait in `GET_LOCK` was cut short (its connection is
/// being closed), from another of `pool`'s connections, in the background within
/// `limit`. A session gone already is no error: the server answers that it knows no
/// such thread.
fn stop_wait(pool: MySqlPool, id: u64, limit: Duration) {
    cleanup::spawn_task(async move {
        match tokio::time::timeout(limit, kill(&pool, id)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::debug!(session = id, error = %e, "lock-core: a cancelled GET_LOCK wait was not stopped; it ends at its own timeout");
            }
            Err(_) => {
                tracing::debug!(
                    session = id,
                    "lock-core: no connection to stop a cancelled GET_LOCK wait within the command timeout; it ends at its own timeout"
                );
            }
        }
    });
}

/// `KILL id` on one of `pool`'s connections, if session `id` still waits in a
/// `GET_LOCK` (a server that restarted meanwhile counts its ids from 1 again).
async fn kill(pool: &MySqlPool, id: u64) -> Result<(), sqlx::Error> {
    let waiting: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
         WHERE ID = ? AND INFO LIKE '%GET_LOCK(%'",
    )
    .bind(id)
    .fetch_one(pool)
    .await?;
    if waiting == 0 {
        return Ok(());
    }
    let sql = format!("KILL {id}");
    sqlx::raw_sql(&sql).execute(pool).await.map(|_| ())
}

/// One `GET_LOCK` name.
pub(crate) struct NamedLock {
    name: String,
}

impl Dialect for NamedLock {
    type Db = MySql;
    const STORE: &'static str = STORE;
    const KIND: crate::metrics::StoreKind = crate::metrics::StoreKind::Mysql;

    fn check<'a>(&'a self, conn: &'a mut PoolConnection<MySql>) -> ConnFuture<'a, bool> {
        Box::pin(async move {
            let ours: Result<Option<i64>, _> =
                sqlx::query_scalar("SELECT IS_USED_LOCK(?) = CONNECTION_ID()")
                    .bind(&self.name)
                    .fetch_one(&mut **conn)
                    .await;
            matches!(ours, Ok(Some(1)))
        })
    }

    fn unlock<'a>(
        &'a self,
        conn: &'a mut PoolConnection<MySql>,
    ) -> ConnFuture<'a, Result<bool, sqlx::Error>> {
        Box::pin(async move {
            let released: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                .bind(&self.name)
                .fetch_one(&mut **conn)
                .await?;
            Ok(released == Some(1))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_hashed_within_the_limit_and_short_ones_kept() {
        assert_eq!(server_name("locks", "order:7"), "locks:order:7");
        let long = "x".repeat(200);
        let a = server_name("locks", &long);
        assert!(a.chars().count() <= MAX_SERVER_NAME, "{a}");
        assert!(a.starts_with("locks:#"), "{a}");
        assert_ne!(a, server_name("locks", &"x".repeat(201)));
        assert_eq!(a, server_name("locks", &long), "stable");
        let wide = server_name(&"n".repeat(100), &long);
        assert!(wide.chars().count() <= MAX_SERVER_NAME, "{wide}");
        // Exactly at the limit: kept.
        let at = "y".repeat(MAX_SERVER_NAME - 6);
        assert_eq!(server_name("locks", &at).chars().count(), MAX_SERVER_NAME);
    }

    #[test]
    fn names_no_server_folds_together_and_no_forged_escape_or_hash() {
        let sent = |name: &str| server_name("lock", name);
        assert_eq!(sent("Order"), "lock:^order");
        assert_eq!(sent("order"), "lock:order");
        // Distinct names stay distinct even compared without case.
        let names = [
            "A", "a", "^a", "%41", "%5ea", "#", "%23", "é", "É", "%c3%a9", "a b", "a%20b",
        ];
        let folded: std::collections::HashSet<String> =
            names.iter().map(|n| sent(n).to_lowercase()).collect();
        assert_eq!(folded.len(), names.len(), "{folded:?}");
        for n in names {
            let s = sent(n);
            assert!(
                s.chars()
                    .all(|c| c.is_ascii_graphic() && !c.is_ascii_uppercase()),
                "{s}"
            );
        }
        // A short name that spells a long name's hashed form is another lock.
        let hashed = sent(&"x".repeat(200));
        let forged = hashed.strip_prefix("lock:").unwrap();
        assert_ne!(sent(forged), hashed);
        assert!(!sent(forged).contains('#'), "{}", sent(forged));
    }
}
