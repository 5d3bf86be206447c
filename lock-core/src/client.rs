//! `LockClient`: the handle users hold; acquisition and waiting live here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::config::{LockConfig, LockOptions, check_lease};
use crate::conn::Conn;
use crate::guard::LockGuard;
use crate::held::{Held, Registry};
use crate::key::{self, LockKeys, LockName};
use crate::notify::{Hub, Turn, wait_for_turn};
use crate::owner::{ClientId, LockScope};
use crate::scripts::{ACQUIRE, RELEASE};
use crate::watchdog::Watchdog;
use crate::{FencingToken, Lease, LockError};

/// A handle on one Redis deployment for taking distributed locks.
///
/// Behavior:
/// - Cheap to clone; clones share one multiplexed connection (a
///   [`ConnectionManager`], which reconnects by itself), one pub/sub connection for
///   waking waiters, and one watchdog task renewing every held lock in batches.
/// - Every Redis call is bounded by [`LockConfig::with_command_timeout`]; when Redis is
///   down calls fail with [`LockError::Redis`] or [`LockError::RedisTimeout`], and work
///   again once it is back.
/// - Locks are reentrant per [`LockScope`]; see there.
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
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.id)
            .field("namespace", &self.inner.config.namespace)
            .field("held", &self.inner.registry.len())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    pub(crate) conn: Conn,
    pub(crate) config: LockConfig,
    pub(crate) id: ClientId,
    pub(crate) id_hex: String,
    pub(crate) registry: Registry,
    pub(crate) hub: Hub,
    pub(crate) watchdog: Watchdog,
}

/// What the caller wants, resolved against the config.
pub(crate) struct Request {
    pub(crate) keys: LockKeys,
    pub(crate) owner: String,
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
}

enum Attempt {
    Granted(LockGuard),
    Busy(Duration),
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
        Self::from_client(redis::Client::open(url)?, config).await
    }

    /// Builds on the user's [`redis::Client`]: opens a [`ConnectionManager`] (timeouts
    /// from `config`) for commands and, lazily, one pub/sub connection for waiters.
    pub async fn from_client(client: redis::Client, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let t = config.command_timeout;
        let manager = tokio::time::timeout(
            t,
            ConnectionManager::new_with_config(client.clone(), manager_config(t, 2)),
        )
        .await
        .map_err(|_| LockError::RedisTimeout {
            op: "connect",
            after: t,
        })??;
        Self::from_connection(manager, Some(client), config)
    }

    /// Like [`open_with_config`](Self::open_with_config), but connects on first use and
    /// fails fast: a server that is down now is not an error here, and while it is down
    /// each call fails after one connection attempt (no reconnect retries inside the
    /// call), so a dead node costs a refused connection, not the command timeout.
    /// [`Redlock::open`](crate::Redlock::open) uses it, so that a Redlock starts with a
    /// minority of its nodes down and does not wait on them. Needs a tokio runtime.
    pub fn open_lazy<T: IntoConnectionInfo>(url: T, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let client = redis::Client::open(url)?;
        let manager = ConnectionManager::new_lazy_with_config(
            client.clone(),
            manager_config(config.command_timeout, 0),
        )?;
        Self::from_connection(manager, Some(client), config)
    }

    /// Builds on the user's own [`ConnectionManager`]. `pubsub` is where waiters'
    /// pub/sub connection goes; with `None`, waiters are woken by this client's own
    /// releases and otherwise poll with backoff.
    pub fn from_connection(
        manager: ConnectionManager,
        pubsub: Option<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let conn = Conn::single(manager, config.command_timeout);
        Self::build(conn, pubsub.into_iter().collect(), config)
    }

    /// Connects to a Redis Cluster through any of its `nodes` (seed addresses; the
    /// others are discovered), with `config`.
    ///
    /// Behavior on a cluster:
    /// - Every key of one lock shares one hash tag, so each script runs on the master
    ///   of that slot; MOVED/ASK redirections and failovers are followed by the
    ///   cluster connection (redis-rs `cluster-async`).
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
        config.validate()?;
        let infos = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()?;
        if infos.is_empty() {
            return Err(LockError::InvalidConfig(
                "open_cluster needs at least one node address".into(),
            ));
        }
        let t = config.command_timeout;
        let cluster = redis::cluster::ClusterClientBuilder::new(infos.clone())
            .connection_timeout(t)
            .response_timeout(t)
            .retries(3)
            .build()?;
        let conn = tokio::time::timeout(t, cluster.get_async_connection())
            .await
            .map_err(|_| LockError::RedisTimeout {
                op: "connect",
                after: t,
            })??;
        let pubsub = infos
            .into_iter()
            .map(redis::Client::open)
            .collect::<Result<Vec<_>, _>>()?;
        Self::from_cluster_connection(conn, pubsub, config)
    }

    /// Builds on the user's own cluster connection. `pubsub` lists nodes of that
    /// cluster for the waiters' pub/sub connection (tried in turn); empty means local
    /// wake-ups and backoff only.
    pub fn from_cluster_connection(
        conn: redis::cluster_async::ClusterConnection,
        pubsub: Vec<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let conn = Conn::cluster(conn, config.command_timeout);
        Self::build(conn, pubsub, config)
    }

    fn build(
        conn: Conn,
        pubsub: Vec<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        let id = ClientId::random()?;
        let id_hex = id.to_hex();
        Ok(Self {
            inner: Arc::new(Inner {
                conn,
                hub: Hub::new(pubsub, id_hex.clone(), config.command_timeout),
                config,
                id,
                id_hex,
                registry: Registry::default(),
                watchdog: Watchdog::default(),
            }),
        })
    }

    /// This client's random id (part of every owner id it uses).
    pub fn id(&self) -> ClientId {
        self.inner.id
    }

    /// The configuration in force.
    pub fn config(&self) -> &LockConfig {
        &self.inner.config
    }

    /// The Redis keys and channel of the lock `name` (for inspection and tooling).
    pub fn keys<N: LockName>(&self, name: N) -> Result<LockKeys, LockError> {
        let c = &self.inner.config;
        key::lock_keys(&c.namespace, &c.delimiter, &name)
    }

    /// Number of locks this client holds or is acquiring right now.
    pub fn held_count(&self) -> usize {
        self.inner.registry.len()
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
        let c = &self.inner.config;
        let delimiter = match options.delimiter {
            Some(d) => {
                key::validate_delimiter(d)?;
                d
            }
            None => &c.delimiter,
        };
        let keys = key::lock_keys(&c.namespace, delimiter, &name)?;
        let (lease, watchdog) = match options.lease.unwrap_or(c.lease) {
            Lease::Fixed(d) => {
                check_lease("lease", d)?;
                (d, false)
            }
            Lease::Watchdog => (c.watchdog_lease, true),
        };
        let scope = options
            .scope
            .or_else(LockScope::current)
            .unwrap_or_default();
        let request = Request {
            owner: scope.owner(&self.inner.id_hex),
            keys,
            lease,
            watchdog,
            max_hold: options.max_hold.or(c.max_hold),
        };
        let wait = options.wait.unwrap_or(c.wait);
        let span = tracing::debug_span!("lock.acquire", lock = %request.keys.name, ?wait);
        self.acquire_request(&request, wait).instrument(span).await
    }

    pub(crate) async fn acquire_request(
        &self,
        req: &Request,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        let runtime = Handle::try_current().map_err(|_| {
            LockError::InvalidConfig("locks must be taken inside a tokio runtime".into())
        })?;
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .unwrap_or(started + crate::config::MAX_LEASE);
        let turn = wait_for_turn(&self.inner, &req.keys.channel, deadline, |_| async {
            Ok(match self.attempt(req, &runtime).await? {
                Attempt::Granted(guard) => Turn::Done(guard),
                Attempt::Busy(retry_after) => Turn::Retry(retry_after),
            })
        })
        .await?;
        match turn {
            Ok(guard) => {
                tracing::debug!(lock = %req.keys.name, token = guard.fencing_token().get(), waited = ?started.elapsed(), "lock granted");
                Ok(guard)
            }
            Err(retry_after) if wait.is_zero() => Err(LockError::Busy {
                key: req.keys.name.clone(),
                retry_after,
            }),
            Err(_) => {
                tracing::debug!(lock = %req.keys.name, ?wait, "lock wait timed out");
                Err(LockError::Timeout {
                    key: req.keys.name.clone(),
                    waited: started.elapsed(),
                })
            }
        }
    }

    /// One acquire script call.
    async fn attempt(&self, req: &Request, runtime: &Handle) -> Result<Attempt, LockError> {
        let (held, _) = self.inner.registry.begin(&req.keys, &req.owner, req.lease);
        let mut pending = PendingAcquire {
            client: self,
            held: Some(held.clone()),
            runtime,
        };
        let start = Instant::now();
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(&req.keys.hash)
            .key(&req.keys.fence)
            .arg(&req.owner)
            .arg(req.lease.as_millis() as u64);
        let reply: Vec<i64> = self.inner.conn.invoke("acquire", &inv).await?;
        match reply[..] {
            [1, count, token] if count >= 1 && token >= 1 => {
                pending.held = None;
                Ok(Attempt::Granted(self.grant(
                    held,
                    count,
                    token as u64,
                    start,
                    req,
                    runtime,
                )))
            }
            [0, pttl] => {
                pending.held = None;
                self.inner.registry.abort(&held);
                Ok(Attempt::Busy(Duration::from_millis(pttl.max(1) as u64)))
            }
            _ => Err(LockError::UnexpectedReply(format!(
                "acquire.lua returned {reply:?}"
            ))),
        }
    }

    fn grant(
        &self,
        held: Arc<Held>,
        count: i64,
        token: u64,
        start: Instant,
        req: &Request,
        runtime: &Handle,
    ) -> LockGuard {
        let stale = {
            let st = held.state();
            st.detached || (count == 1 && st.holds > 0)
        };
        let held = if stale {
            self.inner.registry.renew_entry(&held)
        } else {
            held
        };
        let mut st = held.state();
        st.pending = st.pending.saturating_sub(1);
        st.holds += 1;
        if st.holds == 1 {
            st.token = token;
            st.lease = req.lease;
            st.watchdog = req.watchdog;
            st.valid_until = start + req.lease;
            st.next_renewal = req
                .watchdog
                .then(|| start + self.inner.config.watchdog_period());
            st.renew_until = req.max_hold.and_then(|m| start.checked_add(m));
        } else {
            // The script never shortens the lease of a re-entered lock.
            st.valid_until = st.valid_until.max(start + req.lease);
        }
        let due = st
            .next_renewal
            .unwrap_or(st.valid_until)
            .min(st.valid_until);
        let token = FencingToken::new(st.token);
        drop(st);
        self.inner.watchdog.schedule(&self.inner, due);
        LockGuard::new(self.clone(), held, token, runtime.clone())
    }

    /// Sends a release script call; `mode` is "0" (one hold), "1" (all) or "peek".
    pub(crate) async fn release_call(&self, held: &Held, mode: &str) -> Result<i64, LockError> {
        let lease_ms = held.state().lease.as_millis() as u64;
        let mut inv = RELEASE.prepare_invoke();
        inv.key(&held.keys.hash)
            .key(&held.keys.channel)
            .arg(&held.owner)
            .arg(lease_ms)
            .arg(mode)
            .arg(&self.inner.id_hex);
        self.inner.conn.invoke("release", &inv).await
    }
}

/// Reconnection settings of the single-node connection, bounded by the command timeout;
/// `retries`: reconnection attempts inside one call after the first fails.
fn manager_config(t: Duration, retries: usize) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t))
        .set_response_timeout(Some(t))
        .set_number_of_retries(retries)
        .set_max_delay(Duration::from_secs(1))
}

/// Undoes an acquisition whose outcome is unknown (error, timeout, or the future was
/// dropped mid-request): the script may have granted, so free it in the background
/// unless the owner still holds the lock through other guards.
struct PendingAcquire<'a> {
    client: &'a LockClient,
    held: Option<Arc<Held>>,
    runtime: &'a Handle,
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        if self.client.inner.registry.abort(&held) {
            let client = self.client.clone();
            self.runtime.spawn(async move {
                if let Err(e) = client.release_call(&held, "1").await {
                    tracing::debug!(lock = %held.keys.name, error = %e, "cleanup of an unfinished acquire failed; the lease will free it");
                }
            });
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Let the watchdog task see the client is gone and exit.
        self.watchdog.stop();
    }
}
