//! The seckill (flash-sale) service: vouchers with a stock, one order per user, no
//! oversell, with every piece of the library in its place.
//!
//! The order path (`POST /vouchers/{id}/orders`), from the outside in:
//!
//! 1. `X-User-Id` checked (a stand-in for authentication; missing or malformed: 400);
//! 2. [`RateLimitLayer`](lock_tower::rate_limit::RateLimitLayer): GCRA per user (429);
//! 3. [`IdempotencyLayer`](lock_tower::idempotency::IdempotencyLayer): a retry with the
//!    same `Idempotency-Key` gets the first response replayed;
//! 4. `#[cache_lock]` keyed by voucher and user: a concurrent duplicate of the same
//!    user's order is refused before it does any work (409 `lock-busy`); the lock and the
//!    key in flight free themselves about 2 s after an instance died holding them;
//! 5. an order id from the [`IdGenerator`](lock_core::IdGenerator) (segment mode);
//! 6. `examples/lua/seckill_take.lua`, one atomic script: sale window, stock and buyers
//!    checked, stock decremented, buyer recorded with the order id and the order
//!    queued: appended to a Redis Stream, or with RabbitMQ put in an outbox hash and
//!    then published with a publisher confirm awaited. Oversell and double orders are
//!    impossible here even without the lock; a repeat gets 409 `already-ordered`
//!    naming the existing order;
//! 7. 201 with the order id. A consumer in every instance (the seed's queue for peak
//!    shaving: a consumer group on the stream, or a RabbitMQ consumer) writes the order
//!    into the database (SQLite, or MySQL with `--db mysql://...`), whose UNIQUE
//!    (voucher_id, user_id) index is the seed's last safeguard, then acknowledges it;
//!    what a crashed consumer held is taken over by another. Vouchers and their ids
//!    live in the database too; Redis holds their live stock and buyers, and must
//!    persist (AOF) unless the server is started with `--allow-volatile-redis`.
//!
//! Modules, each importing only those below it: [`server`] (configuration, start-up),
//! `routes` (the HTTP API), `order` and `voucher` (the order path), `app` (the state
//! they share), [`queue`] (the queue trait; the Redis Stream and RabbitMQ), [`store`]
//! (the storage trait; SQLite and MySQL), `clock`; beside them [`load`] (the load
//! generator and its verdict) and [`instances`] (starting service processes for the
//! load generator, the tests and the benchmark).

mod app;
mod clock;
mod fault;
pub mod instances;
mod keys;
pub mod load;
mod order;
mod problem;
pub mod queue;
mod routes;
pub mod server;
pub mod store;
mod voucher;
