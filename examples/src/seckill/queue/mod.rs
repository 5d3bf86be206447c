//! The queue between the order path and the database (the seed's peak shaving) behind
//! a trait: accepted orders wait in it until a consumer in some instance has written
//! them through [`Storage`], and only then are they acknowledged.
//!
//! Every implementation keeps the same contract: an order acknowledged is committed;
//! an order delivered to a consumer that died is delivered again to a live one; a
//! second delivery is harmless (the store's inserts are idempotent).

pub mod rabbit;
pub mod stream;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures_util::future::BoxFuture;
use serde::Serialize;
use tokio::sync::watch;

use super::store::{Inserted, NewOrder, Storage};

/// Errors of a queue: the client's, boxed, so the trait does not name a client.
pub type QueueError = Box<dyn std::error::Error + Send + Sync>;

/// Where the stock script records a taken order, in the same atomic step as the take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptSink {
    /// The orders stream: the queue itself.
    Stream,
    /// The outbox hash, until the broker confirms the order's publish.
    Outbox,
}

/// The queue of accepted orders; see the [module docs](self).
pub trait OrderQueue: Send + Sync + fmt::Debug {
    /// Where the stock script puts a taken order.
    fn script_sink(&self) -> ScriptSink;

    /// Makes a taken order durable in the queue before its 201 is sent (the stream: it
    /// already is, the script appended it).
    fn publish<'a>(&'a self, order: &'a NewOrder) -> BoxFuture<'a, Result<(), QueueError>>;

    /// The queue's depth and consumers, for `GET /healthz`.
    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, QueueError>>;

    /// This instance's consumer figures, shared with the running consumer.
    fn stats(&self) -> Arc<WorkerStats>;

    /// The consumer loop: persists orders into `store`, acknowledging each after the
    /// commit, until `shutdown` turns true (finishing the batch in hand).
    fn consume(
        &self,
        store: Arc<dyn Storage>,
        shutdown: watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()>;
}

/// The queue's backlog.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Backlog {
    /// Which queue: `redis-stream` or `rabbitmq`.
    pub kind: &'static str,
    /// Orders held by the queue (the stream: entries not trimmed yet, acknowledged
    /// ones included; RabbitMQ: messages ready plus orders in the outbox).
    pub length: u64,
    /// Orders delivered to a consumer but not acknowledged (the stream: by any
    /// consumer; RabbitMQ: by this instance's, the broker's own count needs its
    /// management API).
    pub pending: u64,
    /// Whether orders wait that no consumer has received yet.
    pub undelivered: bool,
    /// Consumers the queue knows (the stream: names in the group, including those of
    /// instances that died, until they are removed; RabbitMQ: live subscriptions).
    pub consumers: u64,
}

impl Backlog {
    /// Every order has been persisted and acknowledged.
    pub fn drained(&self) -> bool {
        self.pending == 0 && !self.undelivered
    }
}

/// What a consumer has done so far (shown by `GET /healthz`).
#[derive(Debug, Default)]
pub struct WorkerStats {
    running: AtomicBool,
    read: AtomicU64,
    claimed: AtomicU64,
    persisted: AtomicU64,
    duplicates: AtomicU64,
    trimmed: AtomicU64,
    anomalies: AtomicU64,
}

/// A snapshot of [`WorkerStats`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct WorkerSnapshot {
    /// The consumer loop is running.
    pub running: bool,
    /// New orders received.
    pub read: u64,
    /// Orders taken over from a dead consumer (claimed or redelivered).
    pub claimed: u64,
    /// Rows written.
    pub persisted: u64,
    /// Orders that were already in the database (re-deliveries).
    pub duplicates: u64,
    /// Acknowledged entries this consumer removed from the queue (the stream only).
    pub trimmed: u64,
    /// Orders that conflicted with a different row and were not written (logged as
    /// errors): each is an accepted order the database does not have.
    pub anomalies: u64,
}

impl WorkerStats {
    /// Counts what one batch's insert did, logging each anomaly as an error.
    pub(crate) fn record(&self, inserted: &Inserted) {
        for (order, holder) in &inserted.conflicting {
            tracing::error!(
                order_id = order.order_id,
                voucher_id = order.voucher_id,
                user_id = order.user_id,
                entry = %order.stream_entry,
                row_order_id = ?holder,
                "anomaly: an accepted order conflicts with another row (same voucher and \
                 user under another order id, or its id on another sale); not written"
            );
        }
        self.anomalies
            .fetch_add(inserted.conflicting.len() as u64, Ordering::Relaxed);
        self.persisted
            .fetch_add(inserted.new as u64, Ordering::Relaxed);
        self.duplicates
            .fetch_add(inserted.already_there as u64, Ordering::Relaxed);
    }

    /// The current figures.
    pub fn snapshot(&self) -> WorkerSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        WorkerSnapshot {
            running: self.running.load(Ordering::Relaxed),
            read: get(&self.read),
            claimed: get(&self.claimed),
            persisted: get(&self.persisted),
            duplicates: get(&self.duplicates),
            trimmed: get(&self.trimmed),
            anomalies: get(&self.anomalies),
        }
    }
}
