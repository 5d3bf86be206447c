//! The facades of the stores other than Redis in this crate's layout, each the lock
//! engine over its backend (one guard type, [`LockGuard<B>`](crate::LockGuard), and the
//! same [`DistributedLock`](crate::DistributedLock) trait): the in-memory store and
//! Redisson's layout on Redis (always built), and the database, ZooKeeper and etcd
//! stores behind their cargo features; and [`AnyLocks`], which picks one from a URL.

pub(crate) mod any;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod locks;
pub(crate) mod memory;
#[cfg(any(feature = "zookeeper", feature = "etcd"))]
pub(crate) mod path;
pub(crate) mod redisson;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

pub use any::{AnyGuard, AnyLocks};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdBackend, EtcdGuard, EtcdHolder, EtcdLocks};
pub use locks::Locks;
pub use memory::{MemoryGuard, MemoryLocks};
pub use redisson::{RedissonGuard, RedissonLocks};
#[cfg(feature = "mysql")]
pub use sql::mysql::{FENCE_TABLE as MYSQL_FENCE_TABLE, MysqlBackend, MysqlGuard, MysqlLocks};
#[cfg(feature = "postgres")]
pub use sql::postgres::{
    FENCE_SEQUENCE as POSTGRES_FENCE_SEQUENCE, PostgresBackend, PostgresGuard, PostgresLocks,
};
#[cfg(feature = "zookeeper")]
pub use zookeeper::{ZkBackend, ZkGuard, ZkLocks};
