//! Lock stores other than Redis, behind the same [`DistributedLock`](crate::DistributedLock)
//! trait and the same guard ([`StoreGuard`]): the in-memory store (always built), and
//! the database and ZooKeeper stores behind their cargo features.

pub(crate) mod any;
pub(crate) mod memory;
#[cfg(any(feature = "postgres", feature = "mysql", feature = "zookeeper"))]
pub(crate) mod session;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod sql;
#[cfg(feature = "zookeeper")]
pub(crate) mod zookeeper;

pub use any::{AnyGuard, AnyLocks};
pub use memory::{MemoryGuard, MemoryLocks};
#[cfg(any(feature = "postgres", feature = "mysql", feature = "zookeeper"))]
pub use session::StoreGuard;
#[cfg(feature = "mysql")]
pub use sql::mysql::{FENCE_TABLE as MYSQL_FENCE_TABLE, MysqlLocks};
#[cfg(feature = "postgres")]
pub use sql::postgres::{FENCE_SEQUENCE as POSTGRES_FENCE_SEQUENCE, PostgresLocks};
#[cfg(feature = "zookeeper")]
pub use zookeeper::ZkLocks;
