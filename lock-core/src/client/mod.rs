//! The client room, at the bottom of the house: what every lock, limiter, semaphore,
//! id generator and idempotency store on one Redis deployment shares.
//!
//! [`Client`] holds the connection ([`store::Conn`], with its time limits and batch
//! lanes), the pub/sub hub that wakes waiters ([`wait::Hub`]), this client's random id,
//! and its configuration (namespace and key layout, timeouts, backoff). Capabilities
//! take a `Client` and nothing else; the lock engine (`crate::lock`) builds on it too.
//! Nothing here imports the engine or a capability.
//!
//! Also here: [`cleanup`], the one owner of background work, and [`config`].

pub(crate) mod cleanup;
pub(crate) mod config;
pub(crate) mod homed;
pub(crate) mod store;
pub(crate) mod wait;

use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use self::config::LockConfig;
use self::homed::Make;
use self::store::key::{self, LockKeys, LockName, NameWriter};
use self::store::wire::{Opener, Wire};
use self::store::{Conn, RedisStore, Store, version};
use self::wait::Hub;
use crate::error::{LockError, from_setup};
use crate::metrics::StoreKind;
use crate::owner::ClientId;

/// One Redis deployment's connection, hub, id and configuration. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Client {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Conn,
    hub: Hub,
    id: ClientId,
    id_hex: String,
    config: LockConfig,
    kind: StoreKind,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.shared.id)
            .field("namespace", &self.shared.config.namespace)
            .finish_non_exhaustive()
    }
}

impl Client {
    fn new(
        store: Store,
        pubsub: Vec<redis::Client>,
        config: LockConfig,
        kind: StoreKind,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let conn = Conn::new(
            store,
            config.command_timeout,
            config.batching.then_some(config.batches_in_flight),
        );
        let id = ClientId::random()?;
        let id_hex = id.to_hex();
        Ok(Self {
            shared: Arc::new(Shared {
                hub: Hub::new(pubsub, id_hex.clone(), config.command_timeout),
                conn,
                id,
                id_hex,
                config,
                kind,
            }),
        })
    }

    /// Opens a connection to `client`'s node (a [`Wire`], or a [`ConnectionManager`]
    /// where a `Wire` cannot speak to it; timeouts from `config`), refuses a Redis older
    /// than 7.0, and keeps `client` for the pub/sub connection.
    pub(crate) async fn connect(
        client: redis::Client,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let t = config.command_timeout;
        if let Some(opener) = Opener::for_node(client.get_connection_info(), t, RETRIES) {
            let mut wire = connect_within(t, Wire::open(opener)).await?;
            version::require_supported(&mut wire, t).await?;
            return Self::on_wire(client, wire, config);
        }
        let settings = manager_config(t, RETRIES);
        let mut manager = connect_within(
            t,
            ConnectionManager::new_with_config(client.clone(), settings.clone()),
        )
        .await?;
        version::require_supported(&mut manager, t).await?;
        Self::on_node(client, manager, settings, config)
    }

    /// Connects on first use, with no reconnect retries inside a call (see
    /// `LockClient::open_lazy`).
    pub(crate) fn connect_lazy<T: IntoConnectionInfo>(
        url: T,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        if tokio::runtime::Handle::try_current().is_err() {
            // redis-rs starts the connection's task here, and would panic.
            return Err(LockError::InvalidConfig(
                "a lazily connecting client (open_lazy, Redlock::open) is made inside a \
                 tokio runtime: call it from async code or within Runtime::enter"
                    .into(),
            ));
        }
        let client = redis::Client::open(url).map_err(from_setup)?;
        if let Some(opener) =
            Opener::for_node(client.get_connection_info(), config.command_timeout, 0)
        {
            return Self::on_wire(client, Wire::lazy(opener), config);
        }
        let settings = manager_config(config.command_timeout, 0);
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), settings.clone())?;
        Self::on_node(client, manager, settings, config)
    }

    /// A client on `wire`, opened from `client` (which also opens the pub/sub
    /// connection).
    fn on_wire(client: redis::Client, wire: Wire, config: LockConfig) -> Result<Self, LockError> {
        let store = Store::Node(RedisStore::new(wire, None));
        Self::new(store, vec![client], config, StoreKind::Redis)
    }

    /// A client on `manager`, opened on `client` with `settings`: a new manager like it
    /// (connecting lazily) replaces it when its runtime ends, and `client` also opens the
    /// pub/sub connection.
    fn on_node(
        client: redis::Client,
        manager: ConnectionManager,
        settings: ConnectionManagerConfig,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        let opener = client.clone();
        let remake: Make<_> = Box::new(move || {
            let made = ConnectionManager::new_lazy_with_config(opener.clone(), settings.clone());
            Box::pin(std::future::ready(made))
        });
        let store = Store::Managed(RedisStore::new(manager, Some(remake)));
        Self::new(store, vec![client], config, StoreKind::Redis)
    }

    /// Builds on the user's own [`ConnectionManager`] (no version check).
    pub(crate) fn over_connection(
        manager: ConnectionManager,
        pubsub: Option<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        let store = Store::Managed(RedisStore::new(manager, None));
        Self::new(
            store,
            pubsub.into_iter().collect(),
            config,
            StoreKind::Redis,
        )
    }

    /// Connects to a Redis Cluster through any of its seed `nodes`, refusing masters
    /// older than Redis 7.0.
    pub(crate) async fn connect_cluster<I>(nodes: I, config: LockConfig) -> Result<Self, LockError>
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        config.validate()?;
        let infos = nodes
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<Result<Vec<_>, _>>()
            .map_err(from_setup)?;
        if infos.is_empty() {
            return Err(LockError::InvalidConfig(
                "open_cluster needs at least one node address".into(),
            ));
        }
        let t = config.command_timeout;
        let cluster = redis::cluster::ClusterClientBuilder::new(infos.clone())
            .connection_timeout(t)
            .response_timeout(t)
            // redis-rs would also resend after a lost reply; the store resends only
            // what the cluster refused without running (see `store::deployment`).
            .retries(0)
            .build()
            .map_err(from_setup)?;
        let mut conn = connect_within(t, cluster.get_async_connection()).await?;
        version::require_supported(&mut conn, t).await?;
        let pubsub = infos
            .into_iter()
            .map(redis::Client::open)
            .collect::<Result<Vec<_>, _>>()
            .map_err(from_setup)?;
        let remake: Make<_> = Box::new(move || {
            let cluster = cluster.clone();
            Box::pin(async move { cluster.get_async_connection().await })
        });
        Self::new(
            Store::Cluster(RedisStore::new(conn, Some(remake))),
            pubsub,
            config,
            StoreKind::RedisCluster,
        )
    }

    /// Builds on the user's own cluster connection (no version check).
    pub(crate) fn over_cluster_connection(
        conn: redis::cluster_async::ClusterConnection,
        pubsub: Vec<redis::Client>,
        config: LockConfig,
    ) -> Result<Self, LockError> {
        Self::new(
            Store::Cluster(RedisStore::new(conn, None)),
            pubsub,
            config,
            StoreKind::RedisCluster,
        )
    }

    /// The connection: every Redis call goes through it.
    pub(crate) fn conn(&self) -> &Conn {
        &self.shared.conn
    }

    /// The pub/sub hub that wakes this client's waiters.
    pub(crate) fn hub(&self) -> &Hub {
        &self.shared.hub
    }

    /// This client's random id.
    pub(crate) fn id(&self) -> ClientId {
        self.shared.id
    }

    /// [`id`](Self::id) in hex, as it appears in grant values and claims.
    pub(crate) fn id_hex(&self) -> &str {
        &self.shared.id_hex
    }

    pub(crate) fn config(&self) -> &LockConfig {
        &self.shared.config
    }

    /// The `store` label of this client's metrics.
    pub(crate) fn kind(&self) -> StoreKind {
        self.shared.kind
    }

    /// The keys of the lock `name` under this client's namespace.
    pub(crate) fn lock_keys<N: LockName + ?Sized>(&self, name: &N) -> Result<LockKeys, LockError> {
        let c = &self.shared.config;
        key::lock_keys(&c.namespace, &c.delimiter, name)
    }

    /// The lock keys of `name` under `prefix` (its first part): features that need more
    /// than one key per name derive them all from `.key`, so they share one hash tag.
    pub(crate) fn prefixed_keys<N: LockName + ?Sized>(
        &self,
        prefix: &str,
        name: &N,
    ) -> Result<LockKeys, LockError> {
        self.lock_keys(&Prefixed { prefix, name })
    }

    /// The Redis key for `name` (under `prefix`) with `suffix`: rate and rule keys share
    /// the lock-key layout and escaping.
    pub(crate) fn prefixed_key<N: LockName + ?Sized>(
        &self,
        prefix: &str,
        name: &N,
        suffix: &str,
    ) -> Result<String, LockError> {
        let mut key = self.prefixed_keys(prefix, name)?.key;
        key.push(':');
        key.push_str(suffix);
        Ok(key)
    }
}

/// A feature's name, then the caller's key parts.
struct Prefixed<'a, N: ?Sized> {
    prefix: &'a str,
    name: &'a N,
}

impl<N: LockName + ?Sized> LockName for Prefixed<'_, N> {
    fn write_parts(&self, w: &mut NameWriter) {
        w.part(self.prefix);
        w.own_parts_follow();
        self.name.write_parts(w);
    }
}

/// The span `make` makes, if a subscriber wants debug spans. When none does, the span
/// is not even made: with `tracing`'s `log` feature on, a disabled span still formats
/// its fields for `log`.
pub(crate) fn wanted(make: impl FnOnce() -> tracing::Span) -> Option<tracing::Span> {
    if !tracing::level_enabled!(tracing::Level::DEBUG) {
        return None;
    }
    Some(make()).filter(|span| !span.is_disabled())
}

/// `fut` inside `span`, or bare without one: the wrapper costs on every poll, so a call
/// pays for it only when someone listens. (One future either way, as large as the
/// larger of the two.)
pub(crate) fn in_span<F: std::future::Future>(
    span: Option<tracing::Span>,
    fut: F,
) -> futures_util::future::Either<F, tracing::instrument::Instrumented<F>> {
    use futures_util::future::Either;
    match span {
        None => Either::Left(fut),
        Some(span) => Either::Right(tracing::Instrument::instrument(fut, span)),
    }
}

/// A connection attempt bounded by the command timeout `t`.
async fn connect_within<C>(
    t: Duration,
    connect: impl std::future::Future<Output = redis::RedisResult<C>>,
) -> Result<C, LockError> {
    match tokio::time::timeout(t, connect).await {
        Ok(conn) => Ok(conn?),
        Err(_) => Err(LockError::RedisTimeout {
            op: "connect",
            after: t,
        }),
    }
}

/// Attempts to connect after the first fails, within one call of an eagerly opened
/// client (a lazy one makes one attempt per call).
const RETRIES: usize = 2;

/// Reconnection settings of the single-node connection, bounded by the command timeout;
/// `retries`: reconnection attempts inside one call after the first fails. No response
/// timeout: every call already runs under the store's own limit of the same length
/// (`Conn`, which keeps it without a timer per call); redis-rs's would add a tokio
/// timer to each call. (A timed-out
/// reply never made redis-rs reconnect either; the connect, handshake included, is
/// bounded by the connection timeout.)
fn manager_config(t: Duration, retries: usize) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(t))
        .set_response_timeout(None)
        .set_number_of_retries(retries)
        .set_max_delay(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::wanted;
    use tracing::Level;

    fn subscriber(level: Level) -> impl tracing::Subscriber + Send + Sync {
        tracing_subscriber::fmt().with_max_level(level).finish()
    }

    #[test]
    fn a_span_is_made_only_when_a_subscriber_wants_debug_spans() {
        let make = || tracing::debug_span!("lock.acquire", lock = "order:1");
        assert!(wanted(make).is_none(), "no subscriber");
        tracing::subscriber::with_default(subscriber(Level::DEBUG), || {
            assert!(wanted(make).is_some(), "a subscriber at debug");
        });
        tracing::subscriber::with_default(subscriber(Level::INFO), || {
            assert!(wanted(make).is_none(), "a subscriber at info");
        });
    }
}
