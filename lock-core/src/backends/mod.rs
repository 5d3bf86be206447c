//! The stores the lock engine runs on, each behind the engine's seam
//! ([`Backend`]): one Redis node or a Redis Cluster ([`RedisBackend`]), and this
//! process's memory ([`MemoryBackend`]). Name them in types (`LockGuard<MemoryBackend>`)
//! or bound generic code on `B: Backend`; their handles are the facades
//! ([`LockClient`](crate::LockClient), [`MemoryLocks`](crate::MemoryLocks)).

pub(crate) mod memory;
pub(crate) mod redis;

pub use crate::lock::seam::Backend;
pub use memory::MemoryBackend;
pub use redis::RedisBackend;
