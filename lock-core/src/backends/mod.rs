//! The stores the lock engine runs on, each behind the engine's seam
//! ([`Backend`]): one Redis node or a Redis Cluster ([`RedisBackend`]), this process's
//! memory ([`MemoryBackend`]), and session locks on PostgreSQL and MySQL
//! (`PostgresBackend`, `MysqlBackend`: one `SqlBackend` each, behind their features). Name them in types (`LockGuard<MemoryBackend>`)
//! or bound generic code on `B: Backend`; their handles are the facades
//! ([`LockClient`](crate::LockClient), [`MemoryLocks`](crate::MemoryLocks)).

pub(crate) mod memory;
pub(crate) mod redis;

pub use crate::lock::seam::Backend;
pub use crate::redlock::RedlockBackend;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use crate::stores::sql::SqlBackend;
#[cfg(feature = "mysql")]
pub use crate::stores::sql::mysql::MysqlBackend;
#[cfg(feature = "postgres")]
pub use crate::stores::sql::postgres::PostgresBackend;
#[cfg(feature = "zookeeper")]
pub use crate::stores::zookeeper::ZkBackend;
pub use memory::MemoryBackend;
pub use redis::RedisBackend;
