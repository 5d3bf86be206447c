//! The Redis (this crate's layout and Redisson's) and in-memory backends of the lock
//! engine: each implements the engine's seam ([`Seam`](crate::lock::seam::Seam)) with
//! only what its store alone knows. The other backends sit with their stores
//! (`stores/sql`, `stores/zookeeper`, `redlock/`); the crate root names them all for
//! users (`LockGuard<MemoryBackend>`, ...).

pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod redisson;

pub(crate) use memory::MemoryBackend;
pub(crate) use redis::RedisBackend;
pub(crate) use redisson::RedissonBackend;
