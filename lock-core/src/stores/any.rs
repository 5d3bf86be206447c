//! [`AnyLocks`]: a lock store chosen at run time from a URL.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::client::config::LockConfig;
use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::facade::LockClient;
use crate::lock::LockGuard;
use crate::lock::LockOptions;
use crate::lock::Released;
use crate::lock::seam::Backend;
use crate::owner::FencingToken;
use crate::redlock::Redlock;
use crate::redlock::RedlockGuard;
use crate::stores::memory::{MemoryGuard, MemoryLocks};
use crate::stores::redisson::{RedissonGuard, RedissonLocks};
use crate::traits::DistributedLock;
use crate::traits::HeldLock;

/// A lock store picked by configuration, from one URL:
///
/// | URL | store |
/// | --- | --- |
/// | `redis://host:6379/0`, `rediss://...` | one Redis ([`LockClient`]) |
/// | `redis+cluster://host1:6379,host2:6379`, `rediss+cluster://...` | a Redis Cluster (seed nodes) |
/// | `redlock://host1:6379,host2:6379,host3:6379`, `redlock+tls://...` | [`Redlock`] over independent masters |
/// | `redisson://host:6379/0`, `redisson+tls://...`, `redisson+cluster://h1:6379,h2:6379` | [`RedissonLocks`]: Redisson's layout on one Redis or a Cluster |
/// | `memory://` | [`MemoryLocks`], this process only |
/// | `postgres://user@host/db`, `postgresql://...` | `PostgresLocks` (cargo feature `postgres`) |
/// | `mysql://user:pw@host/db`, `mariadb://...` | `MysqlLocks` (cargo feature `mysql`) |
/// | `zk://host:port[,host:port]/chroot`, `zookeeper://...` | `ZkLocks` (cargo feature `zookeeper`) |
/// | `etcd://host:port[,host:port]/prefix` | `EtcdLocks` (cargo feature `etcd`) |
///
/// In a URL of several hosts, credentials written before the first host
/// (`redlock://user:password@h1:6379,h2:6379,h3:6379`, percent-encoded as in any URL)
/// and a database or query after the last (`/0`, `?protocol=resp3`) apply to every
/// host that names none of its own; `rediss+cluster://` and `redlock+tls://` connect
/// to every host with TLS (`rediss://`, which needs one of the `redis` crate's TLS
/// features).
///
/// An unknown scheme, or a store whose cargo feature is off, is a
/// [`LockError::InvalidConfig`] that says which feature to enable. The guard is
/// [`AnyGuard`]; code written against [`DistributedLock`] takes an `AnyLocks` as it takes
/// any single store.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// use lock_core::{AnyLocks, DistributedLock, HeldLock, LockConfig};
///
/// let url = std::env::var("LOCK_URL").unwrap_or_else(|_| "memory://".into());
/// let locks = AnyLocks::open(&url, LockConfig::new()).await?;
/// let guard = locks.try_lock_named(("invoice", 12_u64)).await?;
/// assert!(guard.is_held());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum AnyLocks {
    /// One Redis node or a Redis Cluster.
    Redis(LockClient),
    /// Redlock over N independent Redis masters.
    Redlock(Redlock),
    /// Locks in this process's memory.
    Memory(MemoryLocks),
    /// Locks in Redisson's layout on one Redis node or a Redis Cluster.
    Redisson(RedissonLocks),
    /// Session advisory locks on PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(crate::PostgresLocks),
    /// `GET_LOCK` named locks on MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(crate::MysqlLocks),
    /// Curator-layout locks on ZooKeeper.
    #[cfg(feature = "zookeeper")]
    Zookeeper(crate::ZkLocks),
    /// Go-layout locks on etcd.
    #[cfg(feature = "etcd")]
    Etcd(crate::EtcdLocks),
}

/// The guard of an [`AnyLocks`] lock.
#[derive(Debug)]
#[must_use = "dropping a guard releases the lock at once"]
#[non_exhaustive]
pub enum AnyGuard {
    /// A Redis or Redis Cluster lock.
    Redis(LockGuard),
    /// A Redlock lock.
    Redlock(RedlockGuard),
    /// A lock in this process's memory.
    Memory(MemoryGuard),
    /// A lock in Redisson's layout.
    Redisson(RedissonGuard),
    /// A PostgreSQL lock.
    #[cfg(feature = "postgres")]
    Postgres(crate::PostgresGuard),
    /// A MySQL or MariaDB lock.
    #[cfg(feature = "mysql")]
    Mysql(crate::MysqlGuard),
    /// A ZooKeeper lock.
    #[cfg(feature = "zookeeper")]
    Zookeeper(crate::ZkGuard),
    /// An etcd lock.
    #[cfg(feature = "etcd")]
    Etcd(crate::EtcdGuard),
}

impl AnyLocks {
    /// Opens the store `url` names (connecting where the store needs a connection).
    pub async fn open(url: &str, config: LockConfig) -> Result<Self, LockError> {
        let shown = || redacted(url);
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            LockError::InvalidConfig(format!(
                "lock store URL {:?} has no scheme; use redis://, redis+cluster://, \
                 redlock://, redisson://, memory://, postgres://, mysql://, zk:// or etcd://",
                shown()
            ))
        })?;
        let hosts = |tls| {
            let hosts = node_urls(rest, tls);
            if hosts.is_empty() {
                Err(LockError::InvalidConfig(format!(
                    "{scheme}:// needs at least one host:port (got {:?})",
                    shown()
                )))
            } else {
                Ok(hosts)
            }
        };
        match scheme {
            "redis" | "rediss" => Ok(Self::Redis(
                LockClient::open_with_config(url, config).await?,
            )),
            "redis+cluster" | "rediss+cluster" => Ok(Self::Redis(
                LockClient::open_cluster(hosts(scheme == "rediss+cluster")?, config).await?,
            )),
            "redlock" | "redlock+tls" => Ok(Self::Redlock(Redlock::open(
                hosts(scheme == "redlock+tls")?,
                config,
            )?)),
            "memory" => Ok(Self::Memory(MemoryLocks::with_config(config)?)),
            "redisson" | "redisson+tls" => {
                let url = format!(
                    "{}://{rest}",
                    if scheme == "redisson" {
                        "redis"
                    } else {
                        "rediss"
                    }
                );
                let client = LockClient::open_with_config(url.as_str(), config).await?;
                Ok(Self::Redisson(RedissonLocks::new(&client)))
            }
            "redisson+cluster" => {
                let client = LockClient::open_cluster(hosts(false)?, config).await?;
                Ok(Self::Redisson(RedissonLocks::new(&client)))
            }
            "postgres" | "postgresql" => Self::postgres(url, config).await,
            "mysql" | "mariadb" => Self::mysql(url, config).await,
            "zk" | "zookeeper" => Self::zookeeper(rest, config).await,
            "etcd" => Self::etcd(rest, config).await,
            other => Err(LockError::InvalidConfig(format!(
                "unknown lock store scheme {other:?} in {:?}; use redis://, rediss://, \
                 redis+cluster://, rediss+cluster://, redlock://, redlock+tls://, redisson://, \
                 redisson+tls://, redisson+cluster://, memory://, postgres://, mysql://, zk:// \
                 or etcd://",
                shown()
            ))),
        }
    }

    #[cfg(feature = "postgres")]
    async fn postgres(url: &str, config: LockConfig) -> Result<Self, LockError> {
        Ok(Self::Postgres(
            crate::PostgresLocks::connect(url, config).await?,
        ))
    }

    #[cfg(not(feature = "postgres"))]
    async fn postgres(_url: &str, _config: LockConfig) -> Result<Self, LockError> {
        Err(LockError::InvalidConfig(
            "postgres:// needs the PostgreSQL store: enable the `postgres` feature of \
             lock-core (lock-core = { version = \"...\", features = [\"postgres\"] })"
                .into(),
        ))
    }

    #[cfg(feature = "zookeeper")]
    async fn zookeeper(cluster: &str, config: LockConfig) -> Result<Self, LockError> {
        Ok(Self::Zookeeper(
            crate::ZkLocks::connect(cluster, config).await?,
        ))
    }

    #[cfg(not(feature = "zookeeper"))]
    async fn zookeeper(_cluster: &str, _config: LockConfig) -> Result<Self, LockError> {
        Err(LockError::InvalidConfig(
            "zk:// needs the ZooKeeper store: enable the `zookeeper` feature of lock-core \
             (lock-core = { version = \"...\", features = [\"zookeeper\"] })"
                .into(),
        ))
    }

    #[cfg(feature = "etcd")]
    async fn etcd(cluster: &str, config: LockConfig) -> Result<Self, LockError> {
        Ok(Self::Etcd(
            crate::EtcdLocks::connect(cluster, config).await?,
        ))
    }

    #[cfg(not(feature = "etcd"))]
    async fn etcd(_cluster: &str, _config: LockConfig) -> Result<Self, LockError> {
        Err(LockError::InvalidConfig(
            "etcd:// needs the etcd store: enable the `etcd` feature of lock-core \
             (lock-core = { version = \"...\", features = [\"etcd\"] })"
                .into(),
        ))
    }

    #[cfg(feature = "mysql")]
    async fn mysql(url: &str, config: LockConfig) -> Result<Self, LockError> {
        // sqlx knows the scheme as mysql://.
        let url = url.replacen("mariadb://", "mysql://", 1);
        Ok(Self::Mysql(crate::MysqlLocks::connect(&url, config).await?))
    }

    #[cfg(not(feature = "mysql"))]
    async fn mysql(_url: &str, _config: LockConfig) -> Result<Self, LockError> {
        Err(LockError::InvalidConfig(
            "mysql:// needs the MySQL store: enable the `mysql` feature of lock-core \
             (lock-core = { version = \"...\", features = [\"mysql\"] })"
                .into(),
        ))
    }

    /// Takes the lock with per-call options.
    pub async fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<AnyGuard, LockError> {
        Ok(match self {
            Self::Redis(c) => AnyGuard::Redis(c.acquire(name, options).await?),
            Self::Redlock(r) => AnyGuard::Redlock(r.acquire(name, options).await?),
            Self::Memory(m) => AnyGuard::Memory(m.acquire(name, options).await?),
            Self::Redisson(r) => AnyGuard::Redisson(r.acquire(name, options).await?),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => AnyGuard::Postgres(p.acquire(name, options).await?),
            #[cfg(feature = "mysql")]
            Self::Mysql(m) => AnyGuard::Mysql(m.acquire(name, options).await?),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(z) => AnyGuard::Zookeeper(z.acquire(name, options).await?),
            #[cfg(feature = "etcd")]
            Self::Etcd(e) => AnyGuard::Etcd(e.acquire(name, options).await?),
        })
    }
}

/// `url` with the password of each of its hosts' credentials masked, to be shown in an
/// error (error text ends up in logs).
fn redacted(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let hosts: Vec<String> = url[start..end]
        .split(',')
        .map(|host| match host.rsplit_once('@') {
            Some((credentials, at)) if credentials.contains(':') => {
                let user = credentials.split(':').next().unwrap_or_default();
                format!("{user}:***@{at}")
            }
            _ => host.to_owned(),
        })
        .collect();
    format!("{}{}{}", &url[..start], hosts.join(","), &url[end..])
}

/// One `redis://` (or `rediss://` with `tls`) URL per host of `rest`, the part of a
/// multi-host URL after `://`: `[user:password@]host:port,host:port[/db][?query]`. The
/// first host's credentials, and the tail, go to every host that has none of its own.
fn node_urls(rest: &str, tls: bool) -> Vec<String> {
    let scheme = if tls { "rediss" } else { "redis" };
    let (hosts, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let tail = tail.strip_prefix('/').unwrap_or(tail);
    let mut shared = None;
    let mut urls = Vec::new();
    for (i, host) in hosts.split(',').enumerate() {
        let (auth, addr) = match host.rsplit_once('@') {
            Some((auth, addr)) => (Some(auth), addr),
            None => (shared, host),
        };
        if i == 0 {
            shared = auth;
        }
        if addr.is_empty() {
            continue;
        }
        let auth = auth.map(|a| format!("{a}@")).unwrap_or_default();
        urls.push(format!("{scheme}://{auth}{addr}/{tail}"));
    }
    urls
}

impl From<LockClient> for AnyLocks {
    fn from(store: LockClient) -> Self {
        Self::Redis(store)
    }
}

impl From<Redlock> for AnyLocks {
    fn from(store: Redlock) -> Self {
        Self::Redlock(store)
    }
}

impl From<MemoryLocks> for AnyLocks {
    fn from(store: MemoryLocks) -> Self {
        Self::Memory(store)
    }
}

impl From<RedissonLocks> for AnyLocks {
    fn from(store: RedissonLocks) -> Self {
        Self::Redisson(store)
    }
}

#[cfg(feature = "postgres")]
impl From<crate::PostgresLocks> for AnyLocks {
    fn from(store: crate::PostgresLocks) -> Self {
        Self::Postgres(store)
    }
}

#[cfg(feature = "mysql")]
impl From<crate::MysqlLocks> for AnyLocks {
    fn from(store: crate::MysqlLocks) -> Self {
        Self::Mysql(store)
    }
}

#[cfg(feature = "zookeeper")]
impl From<crate::ZkLocks> for AnyLocks {
    fn from(store: crate::ZkLocks) -> Self {
        Self::Zookeeper(store)
    }
}

#[cfg(feature = "etcd")]
impl From<crate::EtcdLocks> for AnyLocks {
    fn from(store: crate::EtcdLocks) -> Self {
        Self::Etcd(store)
    }
}

impl DistributedLock for AnyLocks {
    type Guard = AnyGuard;

    fn acquire<N: LockName + Send + Sync>(
        &self,
        name: N,
        options: LockOptions,
    ) -> impl Future<Output = Result<Self::Guard, LockError>> + Send {
        AnyLocks::acquire(self, name, options)
    }
}

/// A boxed `Send` future.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The engine's guard of any store, behind one object-safe face: every variant of
/// [`AnyGuard`] is a `LockGuard<B>`.
trait Erased: Send + Sync {
    fn name(&self) -> &str;
    fn is_held(&self) -> bool;
    fn valid_for(&self) -> Duration;
    fn token(&self) -> Option<FencingToken>;
    fn fence(&self) -> BoxFuture<'_, Result<Option<FencingToken>, LockError>>;
    fn lost(&self) -> BoxFuture<'static, ()>;
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<Released, LockError>>;
    fn hold_until_expiry(self: Box<Self>);
}

impl<B: Backend> Erased for LockGuard<B> {
    fn name(&self) -> &str {
        HeldLock::name(self)
    }
    fn is_held(&self) -> bool {
        HeldLock::is_held(self)
    }
    fn valid_for(&self) -> Duration {
        HeldLock::valid_for(self)
    }
    fn token(&self) -> Option<FencingToken> {
        HeldLock::token(self)
    }
    fn fence(&self) -> BoxFuture<'_, Result<Option<FencingToken>, LockError>> {
        Box::pin(HeldLock::fence(self))
    }
    fn lost(&self) -> BoxFuture<'static, ()> {
        Box::pin(HeldLock::lost(self))
    }
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<Released, LockError>> {
        Box::pin(HeldLock::release(*self))
    }
    fn hold_until_expiry(self: Box<Self>) {
        HeldLock::hold_until_expiry(*self);
    }
}

impl AnyGuard {
    fn erased(&self) -> &dyn Erased {
        match self {
            Self::Redis(g) => g,
            Self::Redlock(g) => g,
            Self::Memory(g) => g,
            Self::Redisson(g) => g,
            #[cfg(feature = "postgres")]
            Self::Postgres(g) => g,
            #[cfg(feature = "mysql")]
            Self::Mysql(g) => g,
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(g) => g,
            #[cfg(feature = "etcd")]
            Self::Etcd(g) => g,
        }
    }

    fn into_erased(self) -> Box<dyn Erased> {
        match self {
            Self::Redis(g) => Box::new(g),
            Self::Redlock(g) => Box::new(g),
            Self::Memory(g) => Box::new(g),
            Self::Redisson(g) => Box::new(g),
            #[cfg(feature = "postgres")]
            Self::Postgres(g) => Box::new(g),
            #[cfg(feature = "mysql")]
            Self::Mysql(g) => Box::new(g),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(g) => Box::new(g),
            #[cfg(feature = "etcd")]
            Self::Etcd(g) => Box::new(g),
        }
    }
}

impl HeldLock for AnyGuard {
    fn name(&self) -> &str {
        self.erased().name()
    }
    fn is_held(&self) -> bool {
        self.erased().is_held()
    }
    fn valid_for(&self) -> Duration {
        self.erased().valid_for()
    }
    fn token(&self) -> Option<FencingToken> {
        self.erased().token()
    }
    fn fence(&self) -> impl Future<Output = Result<Option<FencingToken>, LockError>> + Send {
        self.erased().fence()
    }
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.erased().lost()
    }
    fn release(self) -> impl Future<Output = Result<Released, LockError>> + Send {
        self.into_erased().release()
    }
    fn hold_until_expiry(self) {
        self.into_erased().hold_until_expiry();
    }
}

#[cfg(test)]
mod tests {
    use super::node_urls;

    #[test]
    fn every_host_gets_the_credentials_tls_and_database() {
        assert_eq!(
            node_urls(":pw@h1:1,h2:2,h3:3", false),
            [
                "redis://:pw@h1:1/",
                "redis://:pw@h2:2/",
                "redis://:pw@h3:3/"
            ]
        );
        assert_eq!(
            node_urls("user:p%40ss@h1:1,h2:2/2?protocol=resp3", true),
            [
                "rediss://user:p%40ss@h1:1/2?protocol=resp3",
                "rediss://user:p%40ss@h2:2/2?protocol=resp3"
            ]
        );
        // A host with its own credentials keeps them.
        assert_eq!(
            node_urls("a:x@h1:1,b:y@h2:2,h3:3", false),
            [
                "redis://a:x@h1:1/",
                "redis://b:y@h2:2/",
                "redis://a:x@h3:3/"
            ]
        );
        assert_eq!(
            node_urls("h1:1,,h2:2/", false),
            ["redis://h1:1/", "redis://h2:2/"]
        );
        assert!(node_urls("", false).is_empty());
        assert!(node_urls("pw@", false).is_empty());
    }
}
