//! The AMQP side: a connection with its channel, the queue's declaration, and the
//! publisher every order in flight shares.

use std::sync::atomic::{AtomicU64, Ordering};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::{Message, PUBLISH_TIMEOUT, QUEUE};
use crate::seckill::queue::QueueError;

/// A connection and a channel on it (the connection must outlive the channel).
#[derive(Debug)]
pub(super) struct Link {
    _connection: Connection,
    pub(super) channel: Channel,
    /// Which opening this is, so a failed publish drops only the link it used.
    generation: u64,
}

impl Link {
    /// Connects, opens a channel (in confirm mode if `confirm`) and declares the durable
    /// queue.
    pub(super) async fn open(
        url: &str,
        confirm: bool,
        generation: u64,
    ) -> Result<Self, lapin::Error> {
        let connection = Connection::connect(url, ConnectionProperties::default()).await?;
        let channel = connection.create_channel().await?;
        if confirm {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
        }
        declare(&channel, false).await?;
        Ok(Self {
            _connection: connection,
            channel,
            generation,
        })
    }
}

/// A publisher's link, shared by every order in flight: the lock is held to open it,
/// not while a publish waits for its confirm.
#[derive(Debug, Default)]
pub(super) struct Publisher {
    link: Mutex<Option<Link>>,
    openings: AtomicU64,
}

impl Publisher {
    /// The channel, opened first if there is none or it broke; and its generation.
    pub(super) async fn channel(&self, url: &str) -> Result<(Channel, u64), lapin::Error> {
        let mut link = self.link.lock().await;
        if link
            .as_ref()
            .is_none_or(|l| !l.channel.status().connected())
        {
            let generation = self.openings.fetch_add(1, Ordering::Relaxed) + 1;
            *link = Some(Link::open(url, true, generation).await?);
        }
        match link.as_ref() {
            Some(l) => Ok((l.channel.clone(), l.generation)),
            None => Err(lapin::Error::from(lapin::ErrorKind::InvalidChannelState(
                lapin::ChannelState::Closed,
                "publisher",
            ))),
        }
    }

    /// Drops the link of `generation` (unless a newer one replaced it already).
    async fn forget(&self, generation: u64) {
        let mut link = self.link.lock().await;
        if link.as_ref().is_some_and(|l| l.generation == generation) {
            *link = None;
        }
    }

    /// Publishes `order` and waits for the broker's ack; after a failure the link it
    /// used is dropped, so the next publish opens a new one.
    pub(super) async fn publish(&self, url: &str, order: &Message) -> Result<(), QueueError> {
        let body = serde_json::to_vec(order)?;
        let mut used = None;
        let attempt = async {
            let (channel, generation) = self.channel(url).await?;
            used = Some(generation);
            let properties = BasicProperties::default()
                .with_delivery_mode(2)
                .with_content_type("application/json".into());
            let options = BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            };
            let confirm = channel
                .basic_publish("".into(), QUEUE.into(), options, &body, properties)
                .await?
                .await?;
            if !confirm.is_ack() {
                return Err::<(), QueueError>("the broker refused the order (nack)".into());
            }
            if confirm.take_message().is_some() {
                return Err(format!("the broker has no queue {QUEUE} (message returned)").into());
            }
            Ok(())
        };
        let result = match tokio::time::timeout(PUBLISH_TIMEOUT, attempt).await {
            Ok(result) => result,
            Err(_) => Err(format!("no confirm within {PUBLISH_TIMEOUT:?}").into()),
        };
        if result.is_err()
            && let Some(generation) = used
        {
            self.forget(generation).await;
        }
        result
    }
}

pub(super) async fn declare(
    channel: &Channel,
    passive: bool,
) -> Result<lapin::Queue, lapin::Error> {
    let options = QueueDeclareOptions {
        durable: true,
        passive,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(QUEUE.into(), options, FieldTable::default())
        .await
}
