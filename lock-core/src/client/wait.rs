//! Waking waiters: one pub/sub connection per client, channels reference-counted.
//!
//! Waiters on a lock hold a [`Subscription`] to its release channel. The first
//! subscriber of a channel makes the hub SUBSCRIBE; the last one leaving makes it
//! UNSUBSCRIBE. A release message wakes one local waiter (`notify_one`): only one can
//! win the lock, and a woken waiter that loses simply waits again. Releases made by this
//! client wake its own waiters directly, without the pub/sub round trip.
//!
//! If the pub/sub connection drops, every waiter is woken to re-check (a release may
//! have been missed), and the hub reconnects and resubscribes. Waiters also retry on
//! their own backoff, so a lost message costs latency, never a missed lock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::time::Instant as Clock;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::client::config::Backoff;

/// The message of Redisson's read-write lock that wakes every waiter
/// (`LockPubSub.READ_UNLOCK_MESSAGE`).
const REDISSON_WAKE_ALL: &[u8] = b"1";

/// Local waiters per channel: how many subscriptions, and their wake-up.
type Waiters = Arc<Mutex<HashMap<String, (usize, Arc<Notify>)>>>;

enum Command {
    Subscribe(String, oneshot::Sender<()>),
    Unsubscribe(String),
}

pub(crate) struct Hub {
    waiters: Waiters,
    /// Where the pub/sub connection may go (empty: local wake-ups only).
    clients: Vec<redis::Client>,
    /// The actor's command channel; the actor starts on first subscribe, and again
    /// if the runtime it ran on has ended (its receiver is then gone).
    commands: Mutex<Option<mpsc::UnboundedSender<Command>>>,
    own_id: String,
    timeout: Duration,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("channels", &lock(&self.waiters).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A waiter's interest in one release channel; dropping it unsubscribes.
pub(crate) struct Subscription {
    channel: String,
    notify: Arc<Notify>,
    /// `None`: a wake-up of the store's own, not a hub's channel.
    waiters: Option<Waiters>,
    commands: Option<mpsc::UnboundedSender<Command>>,
}

impl Subscription {
    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(waiters) = &self.waiters else {
            return;
        };
        let mut map = lock(waiters);
        if let Some(entry) = map.get_mut(&self.channel) {
            entry.0 -= 1;
            if entry.0 == 0 {
                map.remove(&self.channel);
                drop(map);
                if let Some(commands) = &self.commands {
                    let _ = commands.send(Command::Unsubscribe(std::mem::take(&mut self.channel)));
                }
            }
        }
    }
}

impl Hub {
    /// `pubsub`: where to open the pub/sub connection, tried in turn (the nodes of a
    /// cluster, where release messages are published cluster-wide); empty means local
    /// wake-ups and backoff only (the user gave us a bare connection).
    pub(crate) fn new(pubsub: Vec<redis::Client>, own_id: String, timeout: Duration) -> Self {
        Self {
            waiters: Waiters::default(),
            clients: pubsub,
            commands: Mutex::new(None),
            own_id,
            timeout,
        }
    }

    /// The running actor's command channel, starting it if needed.
    fn actor(&self) -> Option<mpsc::UnboundedSender<Command>> {
        if self.clients.is_empty() {
            return None;
        }
        let mut commands = lock(&self.commands);
        if let Some(tx) = commands.as_ref().filter(|tx| !tx.is_closed()) {
            return Some(tx.clone());
        }
        // On the background runtime, so that it outlives the runtime of the waiter
        // that started it (the other runtimes' waiters listen through it too).
        let runtime = crate::client::cleanup::lasting_runtime()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let actor = Actor {
            clients: self.clients.clone(),
            next_client: 0,
            waiters: self.waiters.clone(),
            own_id: self.own_id.clone(),
            timeout: self.timeout,
            conn: None,
            subscribed: HashSet::new(),
            retry_at: Instant::now(),
        };
        runtime.spawn(actor.run(rx));
        *commands = Some(tx.clone());
        Some(tx)
    }

    /// Subscribes to `channel`; returns once the server confirmed it, or it failed, or
    /// `limit` passed (the waiter then relies on its backoff).
    pub(crate) async fn subscribe(&self, channel: &str, limit: Duration) -> Subscription {
        let notify = {
            let mut map = lock(&self.waiters);
            let entry = map
                .entry(channel.to_owned())
                .or_insert_with(|| (0, Arc::new(Notify::new())));
            entry.0 += 1;
            entry.1.clone()
        };
        let commands = self.actor();
        let sub = Subscription {
            channel: channel.to_owned(),
            notify,
            waiters: Some(self.waiters.clone()),
            commands: commands.clone(),
        };
        let (ack, done) = oneshot::channel();
        if let Some(commands) = commands
            && commands
                .send(Command::Subscribe(channel.to_owned(), ack))
                .is_ok()
        {
            let _ = tokio::time::timeout(limit.min(self.timeout), done).await;
        }
        sub
    }

    /// Whether any local waiter listens on any channel: a release builds its channel's
    /// name to wake one only then.
    pub(crate) fn has_local_waiters(&self) -> bool {
        !lock(&self.waiters).is_empty()
    }

    /// Wakes one local waiter of `channel` (after this client released the lock).
    pub(crate) fn notify_local(&self, channel: &str) {
        if let Some((_, n)) = lock(&self.waiters).get(channel) {
            n.notify_one();
        }
    }
}

struct Actor {
    /// Where the pub/sub connection may go; `next_client` is tried next.
    clients: Vec<redis::Client>,
    next_client: usize,
    waiters: Waiters,
    own_id: String,
    timeout: Duration,
    conn: Option<(PubSubSink, PubSubStream)>,
    subscribed: HashSet<String>,
    retry_at: Instant,
}

const RECONNECT_DELAY: Duration = Duration::from_millis(200);

impl Actor {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let wanted = !lock(&self.waiters).is_empty();
            if self.conn.is_none() && wanted && Instant::now() >= self.retry_at {
                self.connect().await;
            }
            let retry_at = self.retry_at;
            let reconnect_pending = self.conn.is_none() && wanted;
            tokio::select! {
                cmd = commands.recv() => match cmd {
                    None => return,
                    Some(Command::Subscribe(channel, ack)) => {
                        self.sync_channel(&channel).await;
                        let _ = ack.send(());
                    }
                    Some(Command::Unsubscribe(channel)) => self.sync_channel(&channel).await,
                },
                msg = next_message(&mut self.conn) => match msg {
                    Some(msg) => self.deliver(&msg),
                    None => self.disconnected("pub/sub connection closed"),
                },
                _ = tokio::time::sleep_until(retry_at.into()), if reconnect_pending => {}
            }
        }
    }

    fn deliver(&self, msg: &redis::Msg) {
        // Our own releases already woke our waiters locally.
        if msg.get_payload_bytes() == self.own_id.as_bytes() {
            return;
        }
        if let Some((_, n)) = lock(&self.waiters).get(msg.get_channel_name()) {
            // Redisson's "wake all" (a write hold given back: every reader may go in);
            // its "0" and our clients' ids wake one, who passes the turn on.
            if msg.get_payload_bytes() == REDISSON_WAKE_ALL {
                n.notify_waiters();
            }
            n.notify_one();
        }
    }

    /// Makes the server-side subscription of `channel` match the local waiters.
    async fn sync_channel(&mut self, channel: &str) {
        let wanted = lock(&self.waiters).contains_key(channel);
        if self.conn.is_none() {
            if wanted && Instant::now() >= self.retry_at {
                self.connect().await; // subscribes every wanted channel
            }
            return;
        }
        let have = self.subscribed.contains(channel);
        if wanted == have {
            return;
        }
        let Some((sink, _)) = self.conn.as_mut() else {
            return;
        };
        let result = if wanted {
            tokio::time::timeout(self.timeout, sink.subscribe(channel)).await
        } else {
            tokio::time::timeout(self.timeout, sink.unsubscribe(channel)).await
        };
        match result {
            Ok(Ok(())) if wanted => {
                self.subscribed.insert(channel.to_owned());
            }
            Ok(Ok(())) => {
                self.subscribed.remove(channel);
            }
            _ => self.disconnected("pub/sub (un)subscribe failed"),
        }
    }

    async fn connect(&mut self) {
        let client = &self.clients[self.next_client % self.clients.len()];
        let opened = tokio::time::timeout(self.timeout, client.get_async_pubsub()).await;
        let (mut sink, stream) = match opened {
            Ok(Ok(pubsub)) => pubsub.split(),
            Ok(Err(e)) => return self.failed(&e.to_string()),
            Err(_) => return self.failed("connect timed out"),
        };
        let channels: Vec<String> = lock(&self.waiters).keys().cloned().collect();
        self.subscribed.clear();
        for channel in channels {
            match tokio::time::timeout(self.timeout, sink.subscribe(&channel)).await {
                Ok(Ok(())) => {
                    self.subscribed.insert(channel);
                }
                _ => return self.failed("resubscribe failed"),
            }
        }
        tracing::debug!(channels = self.subscribed.len(), "lock pub/sub connected");
        self.conn = Some((sink, stream));
        // Anything published while we were away is lost: let every waiter re-check.
        self.wake_all();
    }

    fn failed(&mut self, why: &str) {
        // Another node next time (a cluster's nodes all carry the release messages).
        self.next_client = (self.next_client + 1) % self.clients.len();
        tracing::warn!(
            reason = why,
            "lock pub/sub connection failed; waiters fall back to backoff"
        );
        self.retry_at = Instant::now() + RECONNECT_DELAY;
    }

    fn disconnected(&mut self, why: &str) {
        self.conn = None;
        self.subscribed.clear();
        self.failed(why);
        self.wake_all();
    }

    fn wake_all(&self) {
        for (_, n) in lock(&self.waiters).values() {
            n.notify_waiters();
        }
    }
}

async fn next_message(conn: &mut Option<(PubSubSink, PubSubStream)>) -> Option<redis::Msg> {
    match conn {
        Some((_, stream)) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// Where a waiter learns that the state changed.
pub(crate) enum Listen<'h> {
    /// A hub's channel (a Redis release channel).
    Hub(&'h Hub, &'h str),
    /// A wake-up the store fires itself (the memory store's releases).
    Local(Arc<Notify>),
}

/// What one attempt of a waiter found.
pub(crate) enum Turn<T> {
    /// Finished: hand this to the caller.
    Done(T),
    /// Not yet; the state in Redis changes again within this long at the latest (a
    /// holder's remaining lease, the earliest permit expiry, ...).
    Retry(Duration),
}

/// A waiter's hint from a key's PTTL (`pttl_ms`): the key's remaining lease, at least
/// 1 ms. A key without expiry (-1: written by something other than this crate) has no
/// lease to wait for, so `no_expiry` stands in (the config's longest backoff step), and
/// the waiter backs off rather than asking every millisecond.
pub(crate) fn pttl_hint(pttl_ms: i64, no_expiry: Duration) -> Duration {
    match pttl_ms {
        -1 => no_expiry,
        ms => Duration::from_millis(ms.max(1) as u64),
    }
}

/// The one waiting loop of the crate (locks, semaphores, idempotency keys).
///
/// Runs `attempt` until it is [`Turn::Done`] or `deadline` passes. After the first miss
/// it subscribes to `channel` and tries again at once (the state may have changed before
/// the subscription); after that it sleeps until a message on `channel` or a jittered
/// backoff, never past the attempt's hint nor the deadline. The wake-up is armed before
/// each attempt, so a message that arrives during it is not missed. `attempt` learns
/// whether a subscription is active (a waiter woken by one message can pass the turn on
/// with [`Hub::notify_local`]). Returns the last hint when the deadline passes.
///
/// `listen` names where to listen after the first miss (asked only then; a Redlock
/// picks a node that answered); `None` means backoff only. Time is tokio's clock, so a
/// store that follows it (memory) waits on a paused clock as on a real one.
pub(crate) async fn wait_for_turn<'h, T, F, Fut, L>(
    backoff: &Backoff,
    listen: L,
    deadline: Clock,
    mut attempt: F,
) -> Result<Result<T, Duration>, crate::LockError>
where
    F: FnMut(bool) -> Fut,
    Fut: std::future::Future<Output = Result<Turn<T>, crate::LockError>>,
    L: Fn() -> Option<Listen<'h>>,
{
    let mut asked = false;
    let mut subscription: Option<Subscription> = None;
    let mut retries = 0u32;
    loop {
        let notify = subscription.as_ref().map(Subscription::notify);
        let mut notified = notify.as_deref().map(|n| Box::pin(n.notified()));
        if let Some(n) = notified.as_mut() {
            n.as_mut().enable();
        }
        let hint = match attempt(subscription.is_some()).await? {
            Turn::Done(t) => return Ok(Ok(t)),
            Turn::Retry(hint) => hint,
        };
        let now = Clock::now();
        if now >= deadline {
            return Ok(Err(hint));
        }
        if !asked {
            asked = true;
            match listen() {
                Some(Listen::Hub(hub, channel)) => {
                    tracing::trace!(channel, "waiting for a release message");
                    // Boxed: only a busy lock subscribes.
                    subscription = Some(Box::pin(hub.subscribe(channel, deadline - now)).await);
                    continue;
                }
                Some(Listen::Local(notify)) => {
                    subscription = Some(Subscription {
                        channel: String::new(),
                        notify,
                        waiters: None,
                        commands: None,
                    });
                    continue;
                }
                None => {}
            }
        }
        let pause = backoff
            .delay(retries)
            .min(hint)
            .min(deadline - now)
            .max(Duration::from_millis(1));
        retries = retries.saturating_add(1);
        match notified {
            Some(n) => {
                tokio::select! {
                    _ = n => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            None => tokio::time::sleep(pause).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pttl_hint_is_the_lease_left_or_the_stand_in_without_expiry() {
        let longest = Duration::from_secs(1);
        assert_eq!(pttl_hint(250, longest), Duration::from_millis(250));
        assert_eq!(pttl_hint(0, longest), Duration::from_millis(1));
        // Gone since: look again at once.
        assert_eq!(pttl_hint(-2, longest), Duration::from_millis(1));
        assert_eq!(pttl_hint(-1, longest), longest);
    }
}
