//! The orders database behind a trait: the queue's consumers write accepted orders
//! through [`Storage`], the HTTP API reads them back, and vouchers get their ids from
//! it.
//!
//! Every implementation keeps the same contract:
//! - one row per order, and a UNIQUE (voucher_id, user_id) index: the seed's last
//!   safeguard for "one order per user", independent of Redis;
//! - [`Storage::insert_batch`] is idempotent (an order delivered twice is one row) and
//!   its commit is durable when it returns, so the queue may acknowledge right after;
//! - voucher ids are never handed out twice, whatever happened to Redis.

mod mysql;
mod sqlite;

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::Serialize;

pub use mysql::MySqlStore;
pub use sqlite::SqliteStore;

/// Errors of a store: the driver's, boxed, so the trait does not name a driver.
pub type StoreError = Box<dyn std::error::Error + Send + Sync>;

/// Most orders `GET /vouchers/{id}/orders` returns.
pub const MAX_LISTED: i64 = 100_000;

/// An order as the queue carries it and the database keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOrder {
    /// The order id (an [`OrderId`](lock_core::OrderId)'s raw value).
    pub order_id: i64,
    /// The voucher bought.
    pub voucher_id: i64,
    /// The buyer.
    pub user_id: i64,
    /// When the stock was taken, Unix milliseconds on the Redis server's clock.
    pub created_ms: i64,
    /// Where the queue had it (a stream entry id), for the logs.
    pub stream_entry: String,
}

/// A persisted order, as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Order {
    /// The order id, as a string (64-bit ids do not fit a JavaScript number).
    pub order_id: String,
    /// The voucher bought.
    pub voucher_id: i64,
    /// The buyer.
    pub user_id: i64,
    /// When the stock was taken (RFC 3339, UTC).
    pub created_at: String,
}

/// Result of [`Storage::insert_batch`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inserted {
    /// New rows.
    pub new: usize,
    /// Orders already in the table (a re-delivery): left as they were.
    pub already_there: usize,
    /// Orders refused by a different row: each with the order id of the row holding its
    /// voucher and user (`None` if its order id is taken by another sale).
    pub conflicting: Vec<(NewOrder, Option<i64>)>,
}

/// The orders database; see the [module docs](self) for the contract.
pub trait Storage: Send + Sync + fmt::Debug {
    /// Inserts `orders` in one transaction; orders already present are left alone.
    fn insert_batch(&self, orders: Vec<NewOrder>) -> BoxFuture<'_, Result<Inserted, StoreError>>;

    /// Records a new voucher; returns its id (never one handed out before).
    fn create_voucher(
        &self,
        stock: i64,
        begins_at_ms: Option<i64>,
        ends_at_ms: Option<i64>,
    ) -> BoxFuture<'_, Result<i64, StoreError>>;

    /// Whether voucher `id` was ever created.
    fn has_voucher(&self, id: i64) -> BoxFuture<'_, Result<bool, StoreError>>;

    /// The order `order_id`, once persisted.
    fn order(&self, order_id: i64) -> BoxFuture<'_, Result<Option<Order>, StoreError>>;

    /// The persisted orders of `voucher_id` (at most [`MAX_LISTED`]), by order id.
    fn voucher_orders(&self, voucher_id: i64) -> BoxFuture<'_, Result<Vec<Order>, StoreError>>;

    /// Number of rows in `orders` (all vouchers).
    fn count(&self) -> BoxFuture<'_, Result<i64, StoreError>>;
}

/// Opens the store `db` names: `mysql://...` (MySQL or MariaDB), else a SQLite file
/// path.
pub async fn open(db: &str) -> Result<Arc<dyn Storage>, StoreError> {
    if db.starts_with("mysql://") {
        Ok(Arc::new(MySqlStore::connect(db).await?))
    } else {
        Ok(Arc::new(SqliteStore::open(std::path::Path::new(db))?))
    }
}
