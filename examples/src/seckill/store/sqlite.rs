//! The embedded orders database: a SQLite file shared by every instance on the machine.
//!
//! Behavior:
//! - Table `orders` (order_id primary key, voucher_id, user_id, created_ms,
//!   stream_entry, persisted_ms) with a UNIQUE index on (voucher_id, user_id).
//! - Table `vouchers`: the system of record of vouchers. Ids come from its
//!   `AUTOINCREMENT` key, so an id is never handed out twice, whatever happened to
//!   Redis (which holds only a voucher's live stock and buyers).
//! - Writes are idempotent: [`SqliteStore::insert_batch`] uses `ON CONFLICT DO NOTHING`,
//!   so a stream entry persisted twice (a worker that crashed between the commit and
//!   its XACK, a re-delivered stream) never becomes a second row. An order that
//!   conflicts with a different row (the same voucher and user under another order id,
//!   or its order id on another sale) is an anomaly: returned, never a row.
//! - WAL journal and a busy timeout, so several processes can write the same file.
//! - `synchronous=FULL`: a commit is on disk (the WAL fsynced) when it returns, so the
//!   worker's `XACK` after it never acknowledges an order a power loss could roll back
//!   (`NORMAL` in WAL mode syncs only at checkpoints).
//! - Every call runs on tokio's blocking pool; the connection sits behind a mutex.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::{Connection, OptionalExtension, params};

use super::{Inserted, MAX_LISTED, NewOrder, Order, Storage, StoreError};
use crate::seckill::clock::{format_ms, now_ms};

/// How long a write waits for another process's write transaction.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS orders (
    order_id     INTEGER PRIMARY KEY,
    voucher_id   INTEGER NOT NULL,
    user_id      INTEGER NOT NULL,
    created_ms   INTEGER NOT NULL,
    stream_entry TEXT    NOT NULL,
    persisted_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS orders_one_per_user ON orders (voucher_id, user_id);
CREATE TABLE IF NOT EXISTS vouchers (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    stock        INTEGER NOT NULL,
    begins_at_ms INTEGER,
    ends_at_ms   INTEGER,
    created_ms   INTEGER NOT NULL
);
";

/// The SQLite orders database; cheap to clone (clones share the connection).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
}

/// The store's settings and schema on `conn`; every step is safe to repeat.
fn set_up(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(SCHEMA)
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and its schema.
    pub fn open(path: &Path) -> Result<Self, rusqlite::Error> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // Another instance setting up the same fresh file can make the switch to WAL
        // answer "locked" at once, without the busy handler: tried again, within the
        // busy timeout.
        let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
        loop {
            match set_up(&conn) {
                Ok(()) => break,
                Err(rusqlite::Error::SqliteFailure(e, _))
                    if matches!(
                        e.code,
                        rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                    ) && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    async fn with<T, F>(&self, f: F) -> Result<T, rusqlite::Error>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, rusqlite::Error> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock leaves SQLite consistent (the transaction
            // rolls back on drop), so a poisoned mutex is still usable.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?
    }

    /// Inserts `orders` in one transaction; orders already present are left alone.
    pub async fn insert_batch(&self, orders: Vec<NewOrder>) -> Result<Inserted, rusqlite::Error> {
        self.with(move |conn| {
            let now = now_ms();
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let mut inserted = Inserted::default();
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO orders (order_id, voucher_id, user_id, created_ms, stream_entry, persisted_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                )?;
                for o in &orders {
                    let n = stmt.execute(params![
                        o.order_id,
                        o.voucher_id,
                        o.user_id,
                        o.created_ms,
                        o.stream_entry,
                        now
                    ])?;
                    if n == 1 {
                        inserted.new += 1;
                        continue;
                    }
                    let same: Option<(i64, i64)> = tx
                        .prepare_cached(
                            "SELECT voucher_id, user_id FROM orders WHERE order_id = ?1",
                        )?
                        .query_row([o.order_id], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()?;
                    if same == Some((o.voucher_id, o.user_id)) {
                        inserted.already_there += 1;
                    } else {
                        let holder: Option<i64> = tx
                            .prepare_cached(
                                "SELECT order_id FROM orders WHERE voucher_id = ?1 AND user_id = ?2",
                            )?
                            .query_row([o.voucher_id, o.user_id], |r| r.get(0))
                            .optional()?;
                        inserted.conflicting.push((o.clone(), holder));
                    }
                }
            }
            tx.commit()?;
            Ok(inserted)
        })
        .await
    }

    /// Records a new voucher; returns its id (never one handed out before).
    pub async fn create_voucher(
        &self,
        stock: i64,
        begins_at_ms: Option<i64>,
        ends_at_ms: Option<i64>,
    ) -> Result<i64, rusqlite::Error> {
        self.with(move |conn| {
            conn.execute(
                "INSERT INTO vouchers (stock, begins_at_ms, ends_at_ms, created_ms)
                 VALUES (?1, ?2, ?3, ?4)",
                params![stock, begins_at_ms, ends_at_ms, now_ms()],
            )?;
            Ok(conn.last_insert_rowid())
        })
        .await
    }

    /// Whether voucher `id` was ever created.
    pub async fn has_voucher(&self, id: i64) -> Result<bool, rusqlite::Error> {
        self.with(move |conn| {
            conn.prepare_cached("SELECT 1 FROM vouchers WHERE id = ?1")?
                .exists([id])
        })
        .await
    }

    /// The order `order_id`, once persisted.
    pub async fn order(&self, order_id: i64) -> Result<Option<Order>, rusqlite::Error> {
        self.with(move |conn| {
            conn.prepare_cached(
                "SELECT order_id, voucher_id, user_id, created_ms FROM orders WHERE order_id = ?1",
            )?
            .query_row([order_id], row_to_order)
            .optional()
        })
        .await
    }

    /// The persisted orders of `voucher_id` (at most [`MAX_LISTED`]), by order id.
    pub async fn voucher_orders(&self, voucher_id: i64) -> Result<Vec<Order>, rusqlite::Error> {
        self.with(move |conn| {
            conn.prepare_cached(
                "SELECT order_id, voucher_id, user_id, created_ms FROM orders
                 WHERE voucher_id = ?1 ORDER BY order_id LIMIT ?2",
            )?
            .query_map([voucher_id, MAX_LISTED], row_to_order)?
            .collect()
        })
        .await
    }

    /// Number of rows in `orders` (all vouchers).
    pub async fn count(&self) -> Result<i64, rusqlite::Error> {
        self.with(|conn| conn.query_row("SELECT COUNT(*) FROM orders", [], |r| r.get(0)))
            .await
    }
}

impl Storage for SqliteStore {
    fn insert_batch(&self, orders: Vec<NewOrder>) -> BoxFuture<'_, Result<Inserted, StoreError>> {
        Box::pin(async move { Ok(SqliteStore::insert_batch(self, orders).await?) })
    }

    fn create_voucher(
        &self,
        stock: i64,
        begins_at_ms: Option<i64>,
        ends_at_ms: Option<i64>,
    ) -> BoxFuture<'_, Result<i64, StoreError>> {
        Box::pin(async move {
            Ok(SqliteStore::create_voucher(self, stock, begins_at_ms, ends_at_ms).await?)
        })
    }

    fn has_voucher(&self, id: i64) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move { Ok(SqliteStore::has_voucher(self, id).await?) })
    }

    fn order(&self, order_id: i64) -> BoxFuture<'_, Result<Option<Order>, StoreError>> {
        Box::pin(async move { Ok(SqliteStore::order(self, order_id).await?) })
    }

    fn voucher_orders(&self, voucher_id: i64) -> BoxFuture<'_, Result<Vec<Order>, StoreError>> {
        Box::pin(async move { Ok(SqliteStore::voucher_orders(self, voucher_id).await?) })
    }

    fn count(&self) -> BoxFuture<'_, Result<i64, StoreError>> {
        Box::pin(async move { Ok(SqliteStore::count(self).await?) })
    }
}

fn row_to_order(r: &rusqlite::Row<'_>) -> Result<Order, rusqlite::Error> {
    Ok(Order {
        order_id: r.get::<_, i64>(0)?.to_string(),
        voucher_id: r.get(1)?,
        user_id: r.get(2)?,
        created_at: format_ms(r.get(3)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two instances start at once on a fresh file: both open it (switching a new
    /// database to WAL can answer "locked" without waiting on the busy timeout).
    #[test]
    fn instances_opening_one_fresh_file_at_once_all_succeed() {
        let dir = std::env::temp_dir().join(format!("seckill-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for round in 0..30 {
            let path = dir.join(format!("orders-{round}.db"));
            let barrier = Arc::new(std::sync::Barrier::new(4));
            let openers: Vec<_> = (0..4)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        SqliteStore::open(&path).map(drop)
                    })
                })
                .collect();
            for o in openers {
                o.join().unwrap().unwrap();
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The worker acknowledges a batch once `insert_batch` returns, so the commit must
    /// be durable by then: `synchronous` is FULL (2) or EXTRA (3) on the store's own
    /// connection.
    #[test]
    fn commits_are_synced_before_they_return() {
        let dir = std::env::temp_dir().join(format!("seckill-sync-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store = SqliteStore::open(&dir.join("orders.db")).unwrap();
        let conn = store.conn.lock().unwrap();
        let journal: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        let synchronous: i64 = conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(journal, "wal");
        assert!(synchronous >= 2, "synchronous = {synchronous}, not FULL");
        drop(conn);
        drop(store);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
