//! The consumer loop of one instance: deliveries in batches into the database, each
//! batch acknowledged after its commit, and the outbox published again.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use redis::aio::ConnectionManager;
use tokio::sync::watch;

use super::link::{Link, Publisher};
use super::{Message, QUEUE, RabbitConfig};
use crate::seckill::keys::OUTBOX;
use crate::seckill::queue::WorkerStats;
use crate::seckill::store::{NewOrder, Storage};

/// Longest pause between the consumer's retries after an error.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often a consumer looks at the outbox.
const OUTBOX_EVERY: Duration = Duration::from_secs(1);

/// One instance's consumer loop.
pub(super) struct Consumer {
    pub(super) config: RabbitConfig,
    pub(super) redis: ConnectionManager,
    pub(super) store: Arc<dyn Storage>,
    pub(super) stats: Arc<WorkerStats>,
    pub(super) held: Arc<AtomicU64>,
    /// Its own publisher for the outbox.
    pub(super) outbox_publisher: Publisher,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Consumer {
    pub(super) async fn run(self, mut shutdown: watch::Receiver<bool>) {
        self.stats.running.store(true, Ordering::Relaxed);
        tracing::info!(consumer = %self.config.consumer, "RabbitMQ consumer started");
        let mut failures = 0u32;
        while !*shutdown.borrow_and_update() {
            let result = self.session(&mut shutdown).await;
            self.held.store(0, Ordering::Relaxed);
            if let Err(e) = result {
                failures += 1;
                let pause =
                    (Duration::from_millis(50) * 2u32.pow(failures.min(6))).min(MAX_BACKOFF);
                tracing::warn!(error = %e, ?pause, "RabbitMQ consumer: retrying after an error");
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.changed() => {}
                }
            } else {
                failures = 0;
            }
        }
        self.stats.running.store(false, Ordering::Relaxed);
        tracing::info!("RabbitMQ consumer stopped");
    }

    /// One connection's life: consume until shutdown (`Ok`) or an error.
    async fn session(&self, shutdown: &mut watch::Receiver<bool>) -> Result<(), BoxError> {
        let link = Link::open(&self.config.url, false, 0).await?;
        link.channel
            .basic_qos(self.config.batch, BasicQosOptions::default())
            .await?;
        let mut deliveries = link
            .channel
            .basic_consume(
                QUEUE.into(),
                self.config.consumer.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut next_outbox = Instant::now();
        loop {
            if Instant::now() >= next_outbox {
                // Failing alone: the deliveries need only the broker and the database,
                // the outbox needs Redis too.
                if let Err(e) = self.drain_outbox().await {
                    tracing::warn!(error = %e, "RabbitMQ outbox: publishing again failed; trying again in {OUTBOX_EVERY:?}");
                }
                next_outbox = Instant::now() + OUTBOX_EVERY;
            }
            let first = tokio::select! {
                d = deliveries.next() => d,
                _ = tokio::time::sleep_until(next_outbox.into()) => continue,
                _ = shutdown.changed() => return Ok(()),
            };
            let Some(first) = first else {
                return Err("the broker cancelled the consumer".into());
            };
            let mut batch = vec![first?];
            // Whatever else has arrived already, up to a batch.
            while batch.len() < usize::from(self.config.batch) {
                match deliveries.next().now_or_never() {
                    Some(Some(d)) => batch.push(d?),
                    Some(None) => return Err("the broker cancelled the consumer".into()),
                    None => break,
                }
            }
            self.held.fetch_add(batch.len() as u64, Ordering::Relaxed);
            self.persist(&link.channel, batch).await?;
            self.held.store(0, Ordering::Relaxed);
        }
    }

    /// Writes a batch, then acknowledges all of it (one `multiple` ack).
    async fn persist(
        &self,
        channel: &Channel,
        batch: Vec<lapin::message::Delivery>,
    ) -> Result<(), BoxError> {
        let last = batch.last().map(|d| d.delivery_tag).unwrap_or_default();
        let redelivered = batch.iter().filter(|d| d.redelivered).count() as u64;
        self.stats.claimed.fetch_add(redelivered, Ordering::Relaxed);
        let read = self
            .stats
            .read
            .fetch_add(batch.len() as u64 - redelivered, Ordering::Relaxed)
            + batch.len() as u64
            - redelivered;
        if let Some(limit) = self.config.crash_after_reads
            && read >= limit
        {
            tracing::error!(
                read,
                "crash_after_reads reached: exiting with deliveries unacknowledged"
            );
            std::process::exit(3);
        }
        let mut orders = Vec::with_capacity(batch.len());
        for d in &batch {
            match serde_json::from_slice::<Message>(&d.data) {
                Ok(m) => orders.push(NewOrder {
                    order_id: m.order_id,
                    voucher_id: m.voucher_id,
                    user_id: m.user_id,
                    created_ms: m.created_ms,
                    stream_entry: format!("amqp:{}", d.delivery_tag),
                }),
                Err(e) => tracing::error!(
                    tag = d.delivery_tag,
                    error = %e,
                    "malformed order message; acknowledged and skipped"
                ),
            }
        }
        let inserted = self.store.insert_batch(orders).await?;
        self.stats.record(&inserted);
        channel
            .basic_ack(last, BasicAckOptions { multiple: true })
            .await?;
        Ok(())
    }

    /// Publishes again the outbox entries older than `republish_after`, removing each
    /// once confirmed.
    async fn drain_outbox(&self) -> Result<(), BoxError> {
        // The entries' times are the Redis server's (the take script's), so is the cutoff.
        let ((secs, micros), entries): ((i64, i64), Vec<(i64, String)>) = redis::pipe()
            .cmd("TIME")
            .cmd("HGETALL")
            .arg(OUTBOX)
            .query_async(&mut self.redis.clone())
            .await?;
        let now_ms = secs * 1000 + micros / 1000;
        let cutoff = now_ms - self.config.republish_after.as_millis() as i64;
        for (order_id, value) in entries {
            let mut parts = value.split(':').map(str::parse::<i64>);
            let (Some(Ok(voucher_id)), Some(Ok(user_id)), Some(Ok(created_ms))) =
                (parts.next(), parts.next(), parts.next())
            else {
                tracing::error!(order_id, %value, "malformed outbox entry; left alone");
                continue;
            };
            if created_ms > cutoff {
                continue;
            }
            let message = Message {
                order_id,
                voucher_id,
                user_id,
                created_ms,
            };
            self.outbox_publisher
                .publish(&self.config.url, &message)
                .await?;
            let _: i64 = redis::cmd("HDEL")
                .arg(OUTBOX)
                .arg(order_id)
                .query_async(&mut self.redis.clone())
                .await?;
            tracing::info!(order_id, "outbox entry published again");
        }
        Ok(())
    }
}
