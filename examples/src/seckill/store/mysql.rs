//! The orders database on MySQL or MariaDB (`--db mysql://...`), shared by instances on
//! any machine.
//!
//! Behavior:
//! - Tables `seckill_orders` (order_id primary key, voucher_id, user_id, created_ms,
//!   stream_entry, persisted_ms) with a UNIQUE key on (voucher_id, user_id), and
//!   `seckill_vouchers` (AUTO_INCREMENT id), both InnoDB, created if missing.
//! - Writes are idempotent: an insert that hits a unique key is looked at, not retried:
//!   the same order again is counted as already there, another order on the same
//!   voucher and user (or its id on another sale) is an anomaly, returned and never a
//!   row. A failed statement in MySQL rolls back that statement alone, so the rest of
//!   the batch goes on in the same transaction.
//! - A commit is durable when it returns only with `innodb_flush_log_at_trx_commit=1`
//!   (the default): [`MySqlStore::connect`] refuses a server with 0 (a crash of the
//!   server loses up to a second of acknowledged orders) and warns about 2 (an OS
//!   crash can).

use std::time::Duration;

use futures_util::future::BoxFuture;
use sqlx::Row;
use sqlx::mysql::{MySqlPool, MySqlPoolOptions, MySqlRow};

use super::{Inserted, MAX_LISTED, NewOrder, Order, Storage, StoreError};
use crate::seckill::clock::{format_ms, now_ms};

/// Time limit for getting a connection from the pool (or opening one).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per instance: the worker's transaction and the API's reads.
const MAX_CONNECTIONS: u32 = 8;

const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS seckill_orders (
        order_id     BIGINT      NOT NULL PRIMARY KEY,
        voucher_id   BIGINT      NOT NULL,
        user_id      BIGINT      NOT NULL,
        created_ms   BIGINT      NOT NULL,
        stream_entry VARCHAR(64) NOT NULL,
        persisted_ms BIGINT      NOT NULL,
        UNIQUE KEY orders_one_per_user (voucher_id, user_id)
    ) ENGINE=InnoDB",
    "CREATE TABLE IF NOT EXISTS seckill_vouchers (
        id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        stock        BIGINT NOT NULL,
        begins_at_ms BIGINT NULL,
        ends_at_ms   BIGINT NULL,
        created_ms   BIGINT NOT NULL
    ) ENGINE=InnoDB",
];

/// The MySQL orders database; cheap to clone (clones share the pool).
#[derive(Debug, Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
}

impl MySqlStore {
    /// Connects to `url` (`mysql://user:password@host:port/database`), checks that
    /// commits are durable, and creates the tables unless they exist.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = MySqlPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // Read committed: a batch's check after a duplicate key reads the rows as
            // they are, not as its transaction's first read saw them (REPEATABLE READ's
            // snapshot would miss an order another worker committed meanwhile).
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(conn)
                        .await
                        .map(drop)
                })
            })
            .connect(url)
            .await?;
        let flush: i64 =
            sqlx::query_scalar("SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)")
                .fetch_one(&pool)
                .await?;
        match flush {
            1 => {}
            2 => tracing::warn!(
                "innodb_flush_log_at_trx_commit=2: commits survive a crash of the database \
                 server but not of its machine"
            ),
            other => {
                return Err(format!(
                    "innodb_flush_log_at_trx_commit={other}: a crash of the database server \
                     can lose commits the worker has acknowledged; set it to 1"
                )
                .into());
            }
        }
        for table in SCHEMA {
            sqlx::query(table).execute(&pool).await?;
        }
        Ok(Self { pool })
    }

    /// Inserts `orders` in one transaction; orders already present are left alone.
    pub async fn insert_batch(&self, orders: Vec<NewOrder>) -> Result<Inserted, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let now = now_ms();
        let mut inserted = Inserted::default();
        for o in orders {
            let insert = sqlx::query(
                "INSERT INTO seckill_orders
                 (order_id, voucher_id, user_id, created_ms, stream_entry, persisted_ms)
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(o.order_id)
            .bind(o.voucher_id)
            .bind(o.user_id)
            .bind(o.created_ms)
            .bind(&o.stream_entry)
            .bind(now)
            .execute(&mut *tx)
            .await;
            match insert {
                Ok(_) => inserted.new += 1,
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    // Read committed (set per connection): this read sees a row another
                    // worker committed while this one waited on it.
                    let same: Option<(i64, i64)> = sqlx::query_as(
                        "SELECT voucher_id, user_id FROM seckill_orders WHERE order_id = ?",
                    )
                    .bind(o.order_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if same == Some((o.voucher_id, o.user_id)) {
                        inserted.already_there += 1;
                    } else {
                        let holder: Option<i64> = sqlx::query_scalar(
                            "SELECT order_id FROM seckill_orders
                             WHERE voucher_id = ? AND user_id = ?",
                        )
                        .bind(o.voucher_id)
                        .bind(o.user_id)
                        .fetch_optional(&mut *tx)
                        .await?;
                        inserted.conflicting.push((o, holder));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        tx.commit().await?;
        Ok(inserted)
    }

    /// Records a new voucher; returns its id (never one handed out before).
    pub async fn create_voucher(
        &self,
        stock: i64,
        begins_at_ms: Option<i64>,
        ends_at_ms: Option<i64>,
    ) -> Result<i64, sqlx::Error> {
        let done = sqlx::query(
            "INSERT INTO seckill_vouchers (stock, begins_at_ms, ends_at_ms, created_ms)
             VALUES (?, ?, ?, ?)",
        )
        .bind(stock)
        .bind(begins_at_ms)
        .bind(ends_at_ms)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        i64::try_from(done.last_insert_id())
            .map_err(|e| sqlx::Error::Decode(format!("voucher id out of range: {e}").into()))
    }

    /// Whether voucher `id` was ever created.
    pub async fn has_voucher(&self, id: i64) -> Result<bool, sqlx::Error> {
        let found: Option<i64> = sqlx::query_scalar("SELECT id FROM seckill_vouchers WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(found.is_some())
    }

    /// The order `order_id`, once persisted.
    pub async fn order(&self, order_id: i64) -> Result<Option<Order>, sqlx::Error> {
        sqlx::query(
            "SELECT order_id, voucher_id, user_id, created_ms FROM seckill_orders
             WHERE order_id = ?",
        )
        .bind(order_id)
        .fetch_optional(&self.pool)
        .await?
        .map(|r| row_to_order(&r))
        .transpose()
    }

    /// The persisted orders of `voucher_id` (at most [`MAX_LISTED`]), by order id.
    pub async fn voucher_orders(&self, voucher_id: i64) -> Result<Vec<Order>, sqlx::Error> {
        sqlx::query(
            "SELECT order_id, voucher_id, user_id, created_ms FROM seckill_orders
             WHERE voucher_id = ? ORDER BY order_id LIMIT ?",
        )
        .bind(voucher_id)
        .bind(MAX_LISTED)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(row_to_order)
        .collect()
    }

    /// Number of rows in `seckill_orders` (all vouchers).
    pub async fn count(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT COUNT(*) FROM seckill_orders")
            .fetch_one(&self.pool)
            .await
    }
}

fn row_to_order(r: &MySqlRow) -> Result<Order, sqlx::Error> {
    Ok(Order {
        order_id: r.try_get::<i64, _>(0)?.to_string(),
        voucher_id: r.try_get(1)?,
        user_id: r.try_get(2)?,
        created_at: format_ms(r.try_get(3)?),
    })
}

impl Storage for MySqlStore {
    fn insert_batch(&self, orders: Vec<NewOrder>) -> BoxFuture<'_, Result<Inserted, StoreError>> {
        Box::pin(async move { Ok(MySqlStore::insert_batch(self, orders).await?) })
    }

    fn create_voucher(
        &self,
        stock: i64,
        begins_at_ms: Option<i64>,
        ends_at_ms: Option<i64>,
    ) -> BoxFuture<'_, Result<i64, StoreError>> {
        Box::pin(async move {
            Ok(MySqlStore::create_voucher(self, stock, begins_at_ms, ends_at_ms).await?)
        })
    }

    fn has_voucher(&self, id: i64) -> BoxFuture<'_, Result<bool, StoreError>> {
        Box::pin(async move { Ok(MySqlStore::has_voucher(self, id).await?) })
    }

    fn order(&self, order_id: i64) -> BoxFuture<'_, Result<Option<Order>, StoreError>> {
        Box::pin(async move { Ok(MySqlStore::order(self, order_id).await?) })
    }

    fn voucher_orders(&self, voucher_id: i64) -> BoxFuture<'_, Result<Vec<Order>, StoreError>> {
        Box::pin(async move { Ok(MySqlStore::voucher_orders(self, voucher_id).await?) })
    }

    fn count(&self) -> BoxFuture<'_, Result<i64, StoreError>> {
        Box::pin(async move { Ok(MySqlStore::count(self).await?) })
    }
}
