//! Helpers shared by the lock suites.
// Each suite compiles its own copy and uses part of it; `pub` marks what suites call.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lock_core::{Backoff, LockClient, LockConfig};
use lock_tests::{Monitor, RedisServer};

/// A waiters' backoff of `step` at every try (full jitter up to it): long enough that
/// only a release message hands a lock over quickly.
pub fn steady_backoff(step: Duration) -> Backoff {
    Backoff {
        initial: step,
        max: step,
    }
}

/// The guards of the readers `waiting` (tasks that wait for a lock), each within
/// `limit` of the call; a reader that takes longer fails the test with `late` after
/// its number.
pub async fn readers_within<G>(
    waiting: Vec<tokio::task::JoinHandle<Result<G, lock_core::LockError>>>,
    limit: Duration,
    late: &str,
) -> Vec<G> {
    let mut held = Vec::new();
    for (i, reader) in waiting.into_iter().enumerate() {
        let g = tokio::time::timeout(limit, reader)
            .await
            .unwrap_or_else(|_| panic!("reader {i} {late}"))
            .unwrap()
            .unwrap();
        held.push(g);
    }
    held
}

/// A proxy in front of `server`, and a client with the default configuration through it
/// (for tests that break its connection).
pub async fn client_through_proxy(server: &RedisServer) -> (lock_tests::TcpProxy, LockClient) {
    let proxy = lock_tests::TcpProxy::start(server.port());
    let c = LockClient::open_with_config(proxy.url().as_str(), LockConfig::new())
        .await
        .expect("connect lock client through the proxy");
    (proxy, c)
}

/// A client on `server` with `config`.
pub async fn client(server: &RedisServer, config: LockConfig) -> LockClient {
    LockClient::open_with_config(server.url().as_str(), config)
        .await
        .expect("connect lock client")
}

/// A runtime of its own (one worker), for tests that end a runtime on purpose.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Polls `check` until it returns true or `limit` passes; returns the time it took.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The lines `monitor` saw up to now: it waits for a marker command sent after
/// everything before it (the `ECHO "end"` line, last).
pub async fn seen_until_now(server: &RedisServer, monitor: &mut Monitor) -> Vec<String> {
    let mut c = server.connection().await;
    let _: String = redis::cmd("ECHO")
        .arg("end")
        .query_async(&mut c)
        .await
        .expect("ECHO");
    monitor
        .wait_for("\"ECHO\" \"end\"", Duration::from_secs(10))
        .await
        .expect("the marker comes through")
}

/// Whether a line MONITOR saw is a command a client sent, not one a script ran.
fn sent_by_a_client(line: &str) -> bool {
    !line.contains(" lua] ")
}

/// Of the `lines` MONITOR saw, the `SET` commands clients sent (not those scripts ran)
/// on each of `keys`.
pub fn client_sets<K: AsRef<str>>(lines: &[String], keys: &[K]) -> Vec<usize> {
    keys.iter()
        .map(|k| {
            let set = format!("\"SET\" \"{}\"", k.as_ref());
            lines
                .iter()
                .filter(|l| l.contains(&set) && sent_by_a_client(l))
                .count()
        })
        .collect()
}

/// The commands clients sent (not those scripts ran) naming `key`, among what `monitor`
/// saw up to now.
pub async fn client_commands_on(server: &RedisServer, monitor: &mut Monitor, key: &str) -> usize {
    seen_until_now(server, monitor)
        .await
        .iter()
        .filter(|l| l.contains(key) && sent_by_a_client(l))
        .count()
}

/// The `SET` commands clients sent on each of `keys` among what `monitor` saw up to now.
pub async fn sets_of<K: AsRef<str>>(
    server: &RedisServer,
    monitor: &mut Monitor,
    keys: &[K],
) -> Vec<usize> {
    client_sets(&seen_until_now(server, monitor).await, keys)
}

/// Whether a Redis key exists.
pub async fn exists(server: &RedisServer, key: &str) -> bool {
    let mut c = server.connection().await;
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(&mut c)
        .await
        .expect("EXISTS")
        == 1
}

/// The string value of a Redis key (a lock key holds its grant's value).
pub async fn get(server: &RedisServer, key: &str) -> Option<String> {
    let mut c = server.connection().await;
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut c)
        .await
        .expect("GET")
}

/// Writes `value` to `key` without expiry, as another program might.
pub async fn set_by_hand(server: &RedisServer, key: &str, value: &str) {
    let mut c = server.connection().await;
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async::<()>(&mut c)
        .await
        .expect("SET");
}

/// Loads the library's scripts (a first call of each: a plain and a fenced lock, a GCRA
/// decision, an idempotency claim and its completion), so what a test counts or queues
/// afterwards starts with them loaded.
pub async fn load_scripts(c: &LockClient) {
    c.try_lock("warm").await.unwrap().release().await.unwrap();
    // A lone grant is a plain SET: a fenced one loads acquire.lua.
    let fenced = lock_core::LockOptions::new().wait(Duration::ZERO).fenced();
    c.acquire("warm", fenced)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let limiter = c.rate_limiter("warm", lock_core::RateLimit::per_second(10));
    limiter.check("warm").await.unwrap();
    let store = c.idempotency_store("warm");
    if let lock_core::Begin::New(claim) = store
        .begin("warm", "fp", Duration::from_secs(5))
        .await
        .unwrap()
    {
        claim.complete(b"x", Duration::from_secs(5)).await.unwrap();
    }
}

/// The source of a script in `lua/`.
pub fn script_source(file: &str) -> &'static str {
    let (_, src) = lock_core::SCRIPT_SOURCES
        .iter()
        .find(|(name, _)| *name == file)
        .expect("script exists");
    src
}

/// SHA1 of a script in `lua/`, as EVALSHA shows it in MONITOR.
pub fn script_sha(file: &str) -> String {
    redis::Script::new(script_source(file))
        .get_hash()
        .to_string()
}

/// Subscribers of `channel` on the server (PUBSUB NUMSUB).
pub async fn subscribers(server: &RedisServer, channel: &str) -> i64 {
    let mut c = server.connection().await;
    let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(&mut c)
        .await
        .expect("PUBSUB NUMSUB");
    n.first().map_or(0, |(_, n)| *n)
}

/// The lease left on a Redis key, in milliseconds (PTTL).
pub async fn pttl(server: &RedisServer, key: &str) -> i64 {
    let mut c = server.connection().await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// While `guard` believes it holds `name` for `valid_for`, nobody else can take it and
/// the server shows this grant with at least that much lease left.
pub async fn assert_really_held(
    server: &RedisServer,
    other: &LockClient,
    guard: &lock_core::LockGuard,
) {
    let t0 = Instant::now();
    let believed = guard.valid_for();
    assert!(
        guard.is_held(),
        "{guard:?} should believe it holds the lock"
    );
    let key = &guard.keys().key;
    assert_eq!(
        get(server, key).await.as_deref(),
        Some(guard.grant_value()),
        "the server shows another grant than the one {guard:?} believes in"
    );
    let left = pttl(server, key).await;
    // PTTL counts down while we ask: add what passed since `believed` was read.
    assert!(
        Duration::from_millis(left as u64 + 1) + t0.elapsed() >= believed,
        "server lease {left} ms is shorter than the {believed:?} the guard believes in"
    );
    let stolen = other.try_lock(guard.name()).await;
    assert!(
        stolen.as_ref().unwrap_err().is_busy(),
        "another client got {stolen:?}"
    );
}

/// An acquisition going on in a task of its own.
pub type Attempt = tokio::task::JoinHandle<Result<lock_core::LockGuard, lock_core::LockError>>;

/// Starts `attempt` and polls it once: on a paused server that sends its command and
/// leaves it in flight. Then it goes on in a task of its own.
pub async fn in_flight<F>(attempt: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut attempt = Box::pin(attempt);
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(attempt.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "the server is paused");
    tokio::spawn(attempt)
}

/// A client configuration whose batches of one kind go one at a time, so what a test
/// starts while one call is in flight queues behind it and goes as the next batch.
pub fn one_in_flight() -> lock_core::LockConfig {
    lock_core::LockConfig::new().with_batches_in_flight(1)
}

/// `c.try_lock(first)` in flight on a paused server, then `c.try_lock(name)` for each
/// of `names`, queued behind it (`c` configured with [`one_in_flight`]).
pub async fn queue_behind_one<N>(c: &LockClient, first: N, names: &[N]) -> (Attempt, Vec<Attempt>)
where
    N: lock_core::LockName + Clone + Send + 'static,
{
    let first = {
        let c = c.clone();
        in_flight(async move { c.try_lock(first).await }).await
    };
    let queued: Vec<_> = names
        .iter()
        .map(|name| {
            let (c, name) = (c.clone(), name.clone());
            tokio::spawn(async move { c.try_lock(name).await })
        })
        .collect();
    // (If the first had not taken the lane, one of these would go alone instead.)
    eventually(Duration::from_secs(5), "the others to queue", || async {
        c.queued_calls() == names.len()
    })
    .await;
    (first, queued)
}

/// A raw subscriber to one channel: what a waiter of another client, or of another
/// library, receives.
pub struct Listener {
    channel: String,
    messages: std::pin::Pin<Box<dyn futures_util::Stream<Item = redis::Msg> + Send>>,
}

impl Listener {
    /// Subscribed to `channel` when this returns.
    pub async fn on(server: &RedisServer, channel: &str) -> Self {
        let mut pubsub = server.client().get_async_pubsub().await.unwrap();
        pubsub.subscribe(channel).await.unwrap();
        Self {
            channel: channel.to_owned(),
            messages: Box::pin(pubsub.into_on_message()),
        }
    }

    /// The next message's payload, within 5 s.
    pub async fn next(&mut self, what: &str) -> String {
        let msg = tokio::time::timeout(Duration::from_secs(5), self.messages.next())
            .await
            .unwrap_or_else(|_| panic!("no message: {what}"))
            .unwrap();
        msg.get_payload().unwrap()
    }

    /// The first payload not yet read, or `"sentinel"` if nothing was published since:
    /// a sentinel published now, on another connection, comes after every earlier
    /// message.
    pub async fn next_before_sentinel(&mut self, server: &RedisServer) -> String {
        let mut c = server.connection().await;
        let _: i64 = redis::cmd("PUBLISH")
            .arg(&self.channel)
            .arg("sentinel")
            .query_async(&mut c)
            .await
            .unwrap();
        self.next("not even the sentinel").await
    }
}
