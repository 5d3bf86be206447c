//! The facade: `LockClient`, the handle users hold, and its doors to the capabilities
//! on the same deployment ([`capabilities`]). It builds on the lock engine
//! ([`crate::lock`]) and the client room; nothing below imports it.

mod capabilities;

use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;
use redis::aio::ConnectionManager;

use crate::backends::RedisBackend;
use crate::client::config::LockConfig;
use crate::client::store::key::{LockKeys, LockName};
use crate::client::{Client, in_span, wanted};
use crate::error::LockError;
use crate::lock::core::Core;
use crate::lock::{LockGuard, LockOptions};
use crate::owner::ClientId;

/// A handle on one Redis deployment for taking distributed locks.
///
/// Behavior:
/// - Cheap to clone; clones share one pipelined connection (on one node lock-core's
///   own, opened again by itself after a drop or a restart; a [`ConnectionManager`] for
///   TLS, RESP3 or one handed in; a Cluster's on a Cluster), one pub/sub connection
///   for waking waiters, and one watchdog task renewing every held lock in batches.
/// - Every Redis call is bounded by [`LockConfig::with_command_timeout`]; when Redis is
///   down calls fail with [`LockError::Redis`] or [`LockError::RedisTimeout`], and work
///   again once it is back.
/// - Locks are reentrant per [`LockScope`](crate::LockScope); see there.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::LockClient;
///
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// let guard = client.lock(("order", 42_u64)).await?; // waits up to 10 s by default
/// // ... the critical section; stop early if `guard.lost()` resolves ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) inner: Arc<Core<RedisBackend>>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.backend.client().id())
            .field("namespace", &self.inner.config().namespace)
            .field("held", &self.inner.registry.len())
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects to the Redis at `url` with the default [`LockConfig`].
    pub async fn open<T: IntoConnectionInfo>(url: T) -> Result<Self, LockError> {
        Self::open_with_config(url, LockConfig::new()).await
    }

    /// Connects to the Redis at `url` with `config`.
    pub async fn open_with_config<T: IntoConnectionInfo>(
        url: T,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        let client = redis::Client::open(url).map_err(crate::error::from_setup)?;
        Self::from_client(client, config).await
    }

    /// Builds on the user's [`redis::Client`]: opens a connection to its node (timeouts
    /// from `config`) for commands and, lazily, one pub/sub connection for waiters. The
    /// connection is lock-core's own for a plain `redis://` or `redis+unix://` URL in
    /// RESP2 (the password, user and database of the URL are used), a
    /// [`ConnectionManager`] otherwise.
    ///
    /// Reads the server's version once (`INFO server`) and refuses a Redis older than
    /// 7.0 with [`LockError::UnsupportedRedis`]; [`open`](Self::open) and
    /// [`open_with_config`](Self::open_with_config) come here.
    pub async fn from_client(client: redis::Client, config: LockConfig) -> Result<Self, LockError> {
        Ok(Self::over(Client::connect(client, config).await?))
    }

    /// Like [`open_with_config`](Self::open_with_config), but connects on first use and
    /// fails fast: a server that is down now is not an error here, and while it is down
    /// each call fails after one connection attempt (no reconnect retries inside the
    /// call), so a dead node costs a refused connection, not the command timeout.
    /// Connecting later, it cannot refuse a Redis older than 7.0 up front: on such a
    /// server the first script call fails.
    /// [`Redlock::open`](crate::Redlock::open) uses it, so that a Redlock starts with a
    /// minority of its nodes down and does not wait on them. Called outside a tokio runtime it
    /// answers [`LockError::InvalidConfig`] (the connection's task needs one).
    pub fn open_lazy<T: IntoConnectionInfo>(url: T, config: LockConfig) -> Result<Self, LockError> {
        Ok(Self::over(Client::connect_lazy(url, config)?))
    }

    /// Builds on the user's own [`ConnectionManager`]. `pubsub` is where waiters'
    /// pub/sub connection goes; with `None`, waiters are woken by this client's own
    /// releases and otherwise poll with backoff. Unlike [`from_client`](Self::from_client)
    /// it does not ask the server's version: make sure it runs Redis 7.0 or newer.
    pub fn from_connection(
        manager: ConnectionManager,
        pubsub: Option<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        Ok(Self::over(Client::over_connection(
            manager, pubsub, config,
        )?))
    }

    /// Connects to a Redis Cluster through any of its `nodes` (seed addresses; the
    /// others are discovered), with `config`. Like [`from_client`](Self::from_client),
    /// refuses a cluster whose masters run a Redis older than 7.0.
    ///
    /// Behavior on a cluster:
    /// - Every key of one lock shares one hash tag, so each script runs on the master
    ///   of that slot; MOVED/ASK redirections and failovers are followed, by sending
    ///   a call again only when the cluster refused it without running it. A call
    ///   whose reply was lost (a connection reset) is never sent again: it fails with
    ///   the connection's error, and what it may have done is undone as after any
    ///   other error, so no call runs twice.
    /// - Waiters are woken by the release message, published cluster-wide: the pub/sub
    ///   connection goes to one seed node and moves to the next when that one fails.
    /// - The watchdog renews held locks with one script call per hash slot, in
    ///   parallel.
    /// - Replication is asynchronous: when a master fails over, a lock granted on it
    ///   just before may be missing on the promoted replica, and another owner can take
    ///   it. The first holder learns it at its next renewal ([`LockGuard::lost`]
    ///   resolves) and its release answers [`LockError::NotOwner`] or
    ///   [`LockError::Expired`]. Where that window matters, fence the writes, or use
    ///   [`Redlock`](crate::Redlock) over independent masters.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lock_core::LockError> {
    /// use lock_core::{LockClient, LockConfig};
    ///
    /// let client = LockClient::open_cluster(
    ///     ["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"],
    ///     LockConfig::new(),
    /// )
    /// .await?;
    /// let guard = client.lock(("order", 42_u64)).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn open_cluster<I>(nodes: I, config: LockConfig) -> Result<Self, LockError>
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        Ok(Self::over(Client::connect_cluster(nodes, config).await?))
    }

    /// Builds on the user's own cluster connection. `pubsub` lists nodes of that
    /// cluster for the waiters' pub/sub connection (tried in turn); empty means local
    /// wake-ups and backoff only. It does not ask the servers' version: make sure they
    /// run Redis 7.0 or newer.
    ///
    /// Build the connection with `ClusterClientBuilder::retries(0)`: redis-rs's own
    /// retries also send a command again after its reply was lost, and a lock call
    /// sent twice can find its own first write (a `SET NX` then answers busy, a release
    /// `Expired`). Redirections and refusals are followed by this client either way.
    pub fn from_cluster_connection(
        conn: redis::cluster_async::ClusterConnection,
        pubsub: Vec<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        Ok(Self::over(Client::over_cluster_connection(
            conn, pubsub, config,
        )?))
    }

    fn over(client: Client) -> Self {
        Self {
            inner: Arc::new(Core::new(RedisBackend::new(client))),
        }
    }

    /// The lock protocol of this client (what a Redlock asks each node with).
    pub(crate) fn backend(&self) -> &RedisBackend {
        &self.inner.backend
    }

    /// The connection, hub, id and configuration this client's capabilities share.
    pub(crate) fn client(&self) -> &Client {
        self.inner.backend.client()
    }

    /// This client's random id (part of every owner id it uses).
    pub fn id(&self) -> ClientId {
        self.inner.backend.client().id()
    }

    /// The configuration in force.
    pub fn config(&self) -> &LockConfig {
        self.inner.config()
    }

    /// The Redis keys and channel of the lock `name` (for inspection and tooling).
    pub fn keys<N: LockName>(&self, name: N) -> Result<LockKeys, LockError> {
        self.inner.backend.client().lock_keys(&name)
    }

    /// Number of locks this client holds or is acquiring right now.
    pub fn held_count(&self) -> usize {
        self.inner.registry.len()
    }

    /// Entries in the watchdog's renewal queue: one per lock it renews, and stale ones
    /// (of locks released or renewed since), which it drops as they come due or when
    /// they make up half of the queue (so at most about twice the locks renewed, or
    /// 1024).
    pub fn watchdog_entries(&self) -> usize {
        self.inner.watchdog.entries()
    }

    /// Calls (lock acquisitions and releases, rate-limit decisions, idempotency claims
    /// and completions) waiting behind a call in flight to go in the next batch; 0 with
    /// batching off. See [`LockConfig::with_batching`].
    pub fn queued_calls(&self) -> usize {
        self.inner.backend.client().conn().queued_calls()
    }

    /// Takes the lock if it is free (or re-enters it); fails with
    /// [`LockError::Busy`] at once otherwise. Lease: the config's default.
    pub async fn try_lock<N: LockName>(&self, name: N) -> Result<LockGuard, LockError> {
        self.acquire(name, LockOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Takes the lock, waiting up to the config's wait budget
    /// ([`LockConfig::with_wait`], default 10 s) and failing with
    /// [`LockError::Timeout`] after it.
    pub async fn lock<N: LockName>(&self, name: N) -> Result<LockGuard, LockError> {
        self.acquire(name, LockOptions::new()).await
    }

    /// Takes the lock with per-call options.
    ///
    /// Waiting: the waiter subscribes to the lock's release channel and retries when the
    /// holder publishes, with exponential backoff and full jitter as a fallback, never
    /// past the holder's remaining lease nor the wait budget. A Redis error ends the wait
    /// at once with that error; nothing is left held.
    pub async fn acquire<N: LockName>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<LockGuard, LockError> {
        let (request, wait) = self.inner.request(&name, options)?;
        let span =
            wanted(|| tracing::debug_span!("lock.acquire", lock = %request.keys.name(), ?wait));
        in_span(span, self.inner.acquire(&request, wait)).await
    }
}
