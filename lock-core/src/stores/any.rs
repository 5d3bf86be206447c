//! [`AnyLocks`]: a lock store chosen at run time from a URL.

use std::future::Future;
use std::time::Duration;

use crate::key::LockName;
use crate::{
    DistributedLock, FencingToken, HeldLock, LockClient, LockConfig, LockError, LockGuard,
    LockOptions, MemoryLocks, Redlock, RedlockGuard, Released, StoreGuard,
};

/// A lock store picked by configuration, from one URL:
///
/// | URL | store |
/// | --- | --- |
/// | `redis://host:6379/0`, `rediss://...` | one Redis ([`LockClient`]) |
/// | `redis+cluster://host1:6379,host2:6379` | a Redis Cluster (seed nodes) |
/// | `redlock://host1:6379,host2:6379,host3:6379` | [`Redlock`] over independent masters |
/// | `memory://` | [`MemoryLocks`], this process only |
/// | `postgres://user@host/db`, `postgresql://...` | `PostgresLocks` (cargo feature `postgres`) |
/// | `mysql://user:pw@host/db`, `mariadb://...` | `MysqlLocks` (cargo feature `mysql`) |
/// | `zk://host:port[,host:port]/chroot`, `zookeeper://...` | `ZkLocks` (cargo feature `zookeeper`) |
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
    /// Session advisory locks on PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(crate::PostgresLocks),
    /// `GET_LOCK` named locks on MySQL or MariaDB.
    #[cfg(feature = "mysql")]
    Mysql(crate::MysqlLocks),
    /// Curator-layout locks on ZooKeeper.
    #[cfg(feature = "zookeeper")]
    Zookeeper(crate::ZkLocks),
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
    /// A lock of another store (memory, PostgreSQL, MySQL, ZooKeeper).
    Store(StoreGuard),
}

impl AnyLocks {
    /// Opens the store `url` names (connecting where the store needs a connection).
    pub async fn open(url: &str, config: LockConfig) -> Result<Self, LockError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            LockError::InvalidConfig(format!(
                "lock store URL {url:?} has no scheme; use redis://, redis+cluster://, \
                 redlock://, memory://, postgres://, mysql:// or zk://"
            ))
        })?;
        let hosts = || {
            let hosts: Vec<String> = rest
                .trim_end_matches('/')
                .split(',')
                .filter(|h| !h.is_empty())
                .map(|h| format!("redis://{h}/"))
                .collect();
            if hosts.is_empty() {
                Err(LockError::InvalidConfig(format!(
                    "{scheme}:// needs at least one host:port (got {url:?})"
                )))
            } else {
                Ok(hosts)
            }
        };
        match scheme {
            "redis" | "rediss" => Ok(Self::Redis(
                LockClient::open_with_config(url, config).await?,
            )),
            "redis+cluster" => Ok(Self::Redis(
                LockClient::open_cluster(hosts()?, config).await?,
            )),
            "redlock" => Ok(Self::Redlock(Redlock::open(hosts()?, config)?)),
            "memory" => Ok(Self::Memory(MemoryLocks::with_config(config))),
            "postgres" | "postgresql" => Self::postgres(url, config).await,
            "mysql" | "mariadb" => Self::mysql(url, config).await,
            "zk" | "zookeeper" => Self::zookeeper(rest, config).await,
            other => Err(LockError::InvalidConfig(format!(
                "unknown lock store scheme {other:?} in {url:?}; use redis://, rediss://, \
                 redis+cluster://, redlock://, memory://, postgres://, mysql:// or zk://"
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
            Self::Memory(m) => AnyGuard::Store(m.acquire(name, options).await?),
            #[cfg(feature = "postgres")]
            Self::Postgres(p) => AnyGuard::Store(p.acquire(name, options).await?),
            #[cfg(feature = "mysql")]
            Self::Mysql(m) => AnyGuard::Store(m.acquire(name, options).await?),
            #[cfg(feature = "zookeeper")]
            Self::Zookeeper(z) => AnyGuard::Store(z.acquire(name, options).await?),
        })
    }
}

macro_rules! from_store {
    ($($(#[$cfg:meta])* $store:ty => $variant:ident),* $(,)?) => {$(
        $(#[$cfg])*
        impl From<$store> for AnyLocks {
            fn from(store: $store) -> Self {
                Self::$variant(store)
            }
        }
    )*};
}

from_store! {
    LockClient => Redis,
    Redlock => Redlock,
    MemoryLocks => Memory,
    #[cfg(feature = "postgres")]
    crate::PostgresLocks => Postgres,
    #[cfg(feature = "mysql")]
    crate::MysqlLocks => Mysql,
    #[cfg(feature = "zookeeper")]
    crate::ZkLocks => Zookeeper,
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

macro_rules! each {
    ($guard:expr, $g:ident => $body:expr) => {
        match $guard {
            AnyGuard::Redis($g) => $body,
            AnyGuard::Redlock($g) => $body,
            AnyGuard::Store($g) => $body,
        }
    };
}

impl HeldLock for AnyGuard {
    fn name(&self) -> &str {
        each!(self, g => HeldLock::name(g))
    }
    fn is_held(&self) -> bool {
        each!(self, g => HeldLock::is_held(g))
    }
    fn valid_for(&self) -> Duration {
        each!(self, g => HeldLock::valid_for(g))
    }
    fn token(&self) -> Option<FencingToken> {
        each!(self, g => HeldLock::token(g))
    }
    async fn fence(&self) -> Result<Option<FencingToken>, LockError> {
        each!(self, g => HeldLock::fence(g).await)
    }
    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost: crate::stores::session::BoxFuture<()> =
            each!(self, g => Box::pin(HeldLock::lost(g)));
        lost
    }
    async fn release(self) -> Result<Released, LockError> {
        each!(self, g => HeldLock::release(g).await)
    }
    fn hold_until_expiry(self) {
        each!(self, g => HeldLock::hold_until_expiry(g))
    }
}
