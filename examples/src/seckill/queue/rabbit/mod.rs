//! RabbitMQ as the queue (`--queue amqp://...`): the seed's peak shaving on the broker
//! it uses.
//!
//! Behavior:
//! - **Outbox first**: the stock script records a taken order in a Redis hash (the
//!   outbox, `seckill:{seckill}:outbox`) in the same atomic step as the take, so a
//!   taken unit is never nowhere, whatever happens to the publish.
//! - **Confirmed before the 201**: the order is published as a persistent message to
//!   the durable queue [`QUEUE`] on a channel in confirm mode, `mandatory` so an
//!   unroutable message comes back; the 201 waits for the broker's ack (for a
//!   persistent message on a durable queue, sent once it is on disk), then the order
//!   leaves the outbox. A failed or timed-out publish answers 503; the order stays in
//!   the outbox.
//! - **The outbox drains itself**: every consumer publishes again the outbox entries
//!   older than [`RabbitConfig::republish_after`] (an instance died between take and
//!   confirm, or RabbitMQ was down); a second copy of a message is harmless.
//! - **Acknowledged after the commit**: each instance consumes with manual acks and a
//!   prefetch of one batch, writes a batch in one database transaction, then acks it.
//!   A consumer that dies leaves its deliveries unacknowledged, and the broker
//!   redelivers them to a live one; a redelivery is an idempotent insert.
//! - **Survives outages**: a broken connection is opened again with backoff, by the
//!   publisher on its next order and by the consumer in its loop.

mod consumer;
mod link;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::{Backlog, OrderQueue, QueueError, ScriptSink, WorkerStats};
use crate::seckill::keys::OUTBOX;
use crate::seckill::store::{NewOrder, Storage};
use consumer::Consumer;
use link::{Publisher, declare};

/// The durable queue of accepted orders.
pub const QUEUE: &str = "seckill.orders";
/// Time limit of one publish, confirm included.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// Settings of a [`RabbitQueue`].
#[derive(Debug, Clone)]
pub struct RabbitConfig {
    /// The broker, `amqp://user:password@host:port/vhost` (`%2f`: the vhost `/`).
    pub url: String,
    /// This instance's consumer tag; unique per process.
    pub consumer: String,
    /// Orders per database transaction, and the prefetch (default 256).
    pub batch: u16,
    /// An outbox entry this old is published again (default 3 s: longer than a
    /// publish may take, so a live publisher is rarely doubled).
    pub republish_after: Duration,
    /// Fault injection for tests: after this many deliveries read, the process exits at
    /// once, before persisting them (a crash with deliveries unacknowledged). Default:
    /// never.
    pub crash_after_reads: Option<u64>,
}

impl RabbitConfig {
    /// Defaults for the broker at `url`, with `consumer` as the consumer tag.
    pub fn new(url: impl Into<String>, consumer: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            consumer: consumer.into(),
            batch: 256,
            republish_after: Duration::from_secs(3),
            crash_after_reads: None,
        }
    }
}

/// The message body: the order, as JSON.
#[derive(Debug, Serialize, Deserialize)]
struct Message {
    order_id: i64,
    voucher_id: i64,
    user_id: i64,
    created_ms: i64,
}

/// RabbitMQ as the service's [`OrderQueue`]; see the [module docs](self).
#[derive(Debug)]
pub struct RabbitQueue {
    config: RabbitConfig,
    redis: ConnectionManager,
    publisher: Publisher,
    stats: Arc<WorkerStats>,
    /// Deliveries this instance's consumer holds unacknowledged.
    held: Arc<AtomicU64>,
}

impl RabbitQueue {
    /// Connects to the broker (declaring the durable queue), with the outbox on `redis`.
    pub async fn connect(
        config: RabbitConfig,
        redis: ConnectionManager,
    ) -> Result<Self, QueueError> {
        let publisher = Publisher::default();
        publisher.channel(&config.url).await?;
        Ok(Self {
            config,
            redis,
            publisher,
            stats: Arc::default(),
            held: Arc::default(),
        })
    }
}

impl OrderQueue for RabbitQueue {
    fn script_sink(&self) -> ScriptSink {
        ScriptSink::Outbox
    }

    fn publish<'a>(&'a self, order: &'a NewOrder) -> BoxFuture<'a, Result<(), QueueError>> {
        Box::pin(async move {
            let message = Message {
                order_id: order.order_id,
                voucher_id: order.voucher_id,
                user_id: order.user_id,
                created_ms: order.created_ms,
            };
            self.publisher.publish(&self.config.url, &message).await?;
            // Confirmed: the broker has it. Left in the outbox (this call failed), it
            // would only be published once more.
            let _: Result<i64, _> = redis::cmd("HDEL")
                .arg(OUTBOX)
                .arg(order.order_id)
                .query_async(&mut self.redis.clone())
                .await;
            Ok(())
        })
    }

    fn backlog(&self) -> BoxFuture<'_, Result<Backlog, QueueError>> {
        Box::pin(async move {
            let outbox: u64 = redis::cmd("HLEN")
                .arg(OUTBOX)
                .query_async(&mut self.redis.clone())
                .await?;
            // A passive declare on the publisher's channel: the queue's counts. Were the
            // queue gone, the broker would close the channel, and the next publish would
            // open another and declare the queue again. Both steps in one time limit: a
            // broker that stopped answering leaves a channel that still looks open.
            let counts = async {
                let (channel, _) = self.publisher.channel(&self.config.url).await?;
                Ok::<_, QueueError>(declare(&channel, true).await?)
            };
            let queue = tokio::time::timeout(PUBLISH_TIMEOUT, counts)
                .await
                .map_err(|_| format!("no answer from RabbitMQ within {PUBLISH_TIMEOUT:?}"))??;
            let ready = u64::from(queue.message_count());
            Ok(Backlog {
                kind: "rabbitmq",
                length: ready + outbox,
                pending: self.held.load(Ordering::Relaxed),
                undelivered: ready > 0 || outbox > 0,
                consumers: u64::from(queue.consumer_count()),
            })
        })
    }

    fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    fn consume(
        &self,
        store: Arc<dyn Storage>,
        shutdown: watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()> {
        let consumer = Consumer {
            config: self.config.clone(),
            redis: self.redis.clone(),
            store,
            stats: self.stats.clone(),
            held: self.held.clone(),
            outbox_publisher: Publisher::default(),
        };
        Box::pin(consumer.run(shutdown))
    }
}
