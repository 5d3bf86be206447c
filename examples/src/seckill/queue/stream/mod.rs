//! The Redis Stream queue: the stock script appends every accepted order to a stream,
//! and a worker in every instance (a consumer group, the seed's queue for peak
//! shaving) takes them off it into the orders database.
//!
//! Behavior:
//! - **Reads** new entries with `XREADGROUP` as its own consumer of the group
//!   `persist`, in batches, blocking up to half a second when the stream is idle.
//! - **Persists, then acknowledges**: a batch is written in one database transaction
//!   (idempotent inserts, see [`Storage`]) and `XACK`ed only after the commit. A crash
//!   anywhere before the `XACK` leaves the entries pending: nothing accepted is lost,
//!   and a second write of the same entry is a no-op.
//! - **Re-claims** every [`WorkerConfig::claim_idle`] / 2 the entries that have been
//!   pending longer than `claim_idle` (`XAUTOCLAIM`): those of a worker that crashed,
//!   in this or another instance, and its own whose write failed.
//! - **Trims** every [`TRIM_EVERY`] the entries every group has acknowledged
//!   (`XTRIM MINID`, `trim.rs`): pending and undelivered entries are never removed,
//!   and the stream holds the backlog, not the whole sale.
//! - **Survives Redis and database outages**: errors are logged and retried with backoff;
//!   a consumer group that vanished (Redis restarted empty) is created again.
//! - An order that conflicts with a different row (same voucher and user, another
//!   order id) cannot be written: it is logged as an error, counted in
//!   [`WorkerSnapshot::anomalies`](super::WorkerSnapshot::anomalies) (`GET /healthz`) and acknowledged.
//! - A malformed entry (not written by `examples/lua/seckill_take.lua`) is logged and
//!   acknowledged, so it cannot block the stream.

mod reply;
mod trim;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use redis::Value;
use redis::aio::ConnectionManager;
use tokio::sync::watch;

use super::{Backlog, OrderQueue, QueueError, ScriptSink, WorkerStats};
use crate::seckill::keys::{GROUP, STREAM};
use crate::seckill::store::{NewOrder, Storage};
use reply::{Entry, pairs, text};

/// How long one `XREADGROUP` blocks when the stream is idle.
const BLOCK: Duration = Duration::from_millis(500);
/// How often the worker trims what every group has acknowledged.
pub const TRIM_EVERY: Duration = Duration::from_secs(1);
/// Longest pause between retries after an error.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Settings of the stream worker of a [`StreamQueue`].
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's consumer name in the group; unique per process.
    pub consumer: String,
    /// Entries per read (default 256).
    pub batch: usize,
    /// How long an entry stays pending before any worker may claim it (default 5 s).
    pub claim_idle: Duration,
    /// Fault injection for tests: after this many entries read, the process exits at
    /// once, before persisting them (a crash with entries pending). Default: never.
    pub crash_after_reads: Option<u64>,
}

impl WorkerConfig {
    /// Defaults, with `consumer` as the consumer name.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
            batch: 256,
            claim_idle: Duration::from_secs(5),
            crash_after_reads: None,
        }
    }
}

/// Creates the consumer group (from the stream's start, creating the stream) unless it
/// exists.
pub(crate) async fn ensure_group(conn: &mut ConnectionManager) -> Result<(), redis::RedisError> {
    let created: Result<(), _> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(STREAM)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// The orders stream's backlog.
pub(crate) async fn backlog(conn: &mut ConnectionManager) -> Result<Backlog, redis::RedisError> {
    let stream: Value = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(STREAM)
        .query_async(conn)
        .await?;
    let groups: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(STREAM)
        .query_async(conn)
        .await?;
    let odd = || redis::RedisError::from((redis::ErrorKind::Parse, "unexpected XINFO reply"));
    let field = |fields: &[(String, &Value)], name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| text(v))
    };
    let s = pairs(&stream).ok_or_else(odd)?;
    let length: u64 = field(&s, "length")
        .and_then(|l| l.parse().ok())
        .ok_or_else(odd)?;
    let last_added = field(&s, "last-generated-id").ok_or_else(odd)?;
    let Value::Array(groups) = groups else {
        return Err(odd());
    };
    for g in &groups {
        let g = pairs(g).ok_or_else(odd)?;
        if field(&g, "name").as_deref() == Some(GROUP) {
            let pending = field(&g, "pending")
                .and_then(|p| p.parse().ok())
                .ok_or_else(odd)?;
            let delivered = field(&g, "last-delivered-id").ok_or_else(odd)?;
            let consumers = field(&g, "consumers")
                .and_then(|c| c.parse().ok())
                .ok_or_else(odd)?;
            return Ok(Backlog {
                kind: "redis-stream",
                length,
                pending,
                undelivered: length > 0 && delivered != last_added,
                consumers,
            });
        }
    }
    Ok(Backlog {
        kind: "redis-stream",
        length,
        pending: 0,
        undelivered: length > 0,
        consumers: 0,
    })
}

/// The stream as the service's [`OrderQueue`]: the backlog read on the request
/// path's connection, the worker on a connection of its own.
#[derive(Debug)]
pub struct StreamQueue {
    conn: ConnectionManager,
    worker_conn: ConnectionManager,
    config: WorkerConfig,
    stats: Arc<WorkerStats>,
}

impl StreamQueue {
    /// The queue on `conn`, its worker on `worker_conn` (it blocks in `XREADGROUP`,
    /// so it must not share a connection with request handlers; give it a response
    /// timeout above half a second). Creates the consumer group unless it exists.
    pub async fn new(
        mut conn: ConnectionManager,
        worker_conn: ConnectionManager,
        config: WorkerConfig,
    ) -> Result<Self, redis::RedisError> {
        ensure_group(&mut conn).await?;
        Ok(Self {
            conn,
            worker_conn,
            config,
            stats: Arc::default(),
        })
    }
}

impl OrderQueue for StreamQueue {
    fn script_sink(&self) -> ScriptSink {
        ScriptSink::Stream
    }

    fn publish<'a>(&'a self, _order: &'a NewOrder) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }

    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, QueueError>> {
        Box::pin(async move { Ok(backlog(&mut self.conn.clone()).await?) })
    }

    fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    fn consume(
        &self,
        store: Arc<dyn Storage>,
        shutdown: watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()> {
        let worker = Worker {
            conn: self.worker_conn.clone(),
            store,
            config: self.config.clone(),
            stats: self.stats.clone(),
        };
        Box::pin(worker.run(shutdown))
    }
}

/// One instance's worker; see the [module docs](self).
#[derive(Debug)]
struct Worker {
    conn: ConnectionManager,
    store: Arc<dyn Storage>,
    config: WorkerConfig,
    stats: Arc<WorkerStats>,
}

impl Worker {
    /// Runs until `shutdown` turns true (finishing the batch in hand).
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        self.stats.running.store(true, Ordering::Relaxed);
        tracing::info!(consumer = %self.config.consumer, "stream worker started");
        let claim_every = (self.config.claim_idle / 2).max(Duration::from_millis(50));
        let mut next_claim = Instant::now();
        let mut next_trim = Instant::now();
        let mut failures = 0u32;
        while !*shutdown.borrow_and_update() {
            let round = async {
                if Instant::now() >= next_claim {
                    self.claim_idle_entries().await?;
                    next_claim = Instant::now() + claim_every;
                }
                if Instant::now() >= next_trim {
                    let n = trim::trim_acknowledged(&mut self.conn).await?;
                    self.stats.trimmed.fetch_add(n, Ordering::Relaxed);
                    next_trim = Instant::now() + TRIM_EVERY;
                }
                self.read_new().await
            };
            match round.await {
                Ok(()) => failures = 0,
                Err(e) => {
                    failures += 1;
                    let pause =
                        (Duration::from_millis(50) * 2u32.pow(failures.min(6))).min(MAX_BACKOFF);
                    tracing::warn!(error = %e, ?pause, "stream worker: retrying after an error");
                    let no_group = e
                        .downcast_ref::<redis::RedisError>()
                        .is_some_and(|e| e.code() == Some("NOGROUP"));
                    if no_group {
                        let _ = ensure_group(&mut self.conn).await;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = shutdown.changed() => {}
                    }
                }
            }
        }
        self.stats.running.store(false, Ordering::Relaxed);
        tracing::info!("stream worker stopped");
    }

    async fn read_new(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.config.consumer)
            .arg("COUNT")
            .arg(self.config.batch)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(STREAM)
            .arg(">")
            .query_async(&mut self.conn)
            .await?;
        let entries = reply::read_group(&reply)
            .ok_or_else(|| format!("unexpected XREADGROUP reply: {reply:?}"))?;
        if entries.is_empty() {
            return Ok(());
        }
        let read = self
            .stats
            .read
            .fetch_add(entries.len() as u64, Ordering::Relaxed)
            + entries.len() as u64;
        if let Some(limit) = self.config.crash_after_reads
            && read >= limit
        {
            tracing::error!(
                read,
                "crash_after_reads reached: exiting with entries pending"
            );
            std::process::exit(3);
        }
        self.persist(entries).await
    }

    async fn claim_idle_entries(&mut self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut cursor = "0-0".to_string();
        // Bounded, so new entries are not starved by a huge pending list.
        for _ in 0..16 {
            let reply: Value = redis::cmd("XAUTOCLAIM")
                .arg(STREAM)
                .arg(GROUP)
                .arg(&self.config.consumer)
                .arg(self.config.claim_idle.as_millis() as u64)
                .arg(&cursor)
                .arg("COUNT")
                .arg(self.config.batch)
                .query_async(&mut self.conn)
                .await?;
            let (next, entries) = reply::autoclaim(&reply)
                .ok_or_else(|| format!("unexpected XAUTOCLAIM reply: {reply:?}"))?;
            if !entries.is_empty() {
                tracing::info!(count = entries.len(), "claimed idle pending orders");
                self.stats
                    .claimed
                    .fetch_add(entries.len() as u64, Ordering::Relaxed);
                self.persist(entries).await?;
            }
            if next == "0-0" {
                break;
            }
            cursor = next;
        }
        Ok(())
    }

    /// Writes the orders of `entries`, then acknowledges all of them.
    async fn persist(
        &mut self,
        entries: Vec<Entry>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let ids: Vec<String> = entries.iter().map(|e| e.id.clone()).collect();
        let mut orders = Vec::with_capacity(entries.len());
        for e in entries {
            match e.order {
                Some(o) => orders.push(o),
                None => {
                    tracing::error!(entry = %e.id, "malformed order entry; acknowledged and skipped")
                }
            }
        }
        let inserted = self.store.insert_batch(orders).await?;
        self.stats.record(&inserted);
        let _: i64 = redis::cmd("XACK")
            .arg(STREAM)
            .arg(GROUP)
            .arg(&ids)
            .query_async(&mut self.conn)
            .await?;
        tracing::debug!(
            new = inserted.new,
            already_there = inserted.already_there,
            "orders persisted"
        );
        Ok(())
    }
}
