//! Every Redis key of the service, built in one place.
//!
//! All keys share the hash tag `{seckill}`, so the stock script (which touches a
//! voucher's hash, its buyers and the orders stream or outbox) stays in one slot should the
//! deployment ever be a Redis Cluster. The lock, rate-limit, id and idempotency keys
//! belong to lock-core, under its own namespace.

/// The orders stream: one entry per accepted order (`examples/lua/seckill_take.lua`).
pub(crate) const STREAM: &str = "seckill:{seckill}:orders";
/// The consumer group of the workers that persist the stream into the database.
pub(crate) const GROUP: &str = "persist";
/// With RabbitMQ: the orders taken but not yet confirmed by the broker, a hash from
/// order id to `voucher:user:created_ms` (`examples/lua/seckill_take.lua`); an entry
/// left behind (its instance died, RabbitMQ was down) is published again.
pub(crate) const OUTBOX: &str = "seckill:{seckill}:outbox";

/// The hash of voucher `id`: `stock` (left), `sold`, `initial`, `begins_at_ms`,
/// `ends_at_ms` (empty: no bound).
pub(crate) fn voucher(id: i64) -> String {
    format!("seckill:{{seckill}}:voucher:{id}")
}

/// The buyers of voucher `id`: a hash from user id to that user's order id.
pub(crate) fn buyers(id: i64) -> String {
    format!("seckill:{{seckill}}:buyers:{id}")
}
