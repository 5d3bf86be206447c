//! The Redis and in-memory backends of the lock engine: each implements the engine's
//! seam ([`Seam`](crate::lock::seam::Seam)) with only what its store alone knows. The
//! other backends sit with their stores (`stores/sql`, `stores/zookeeper`, `redlock/`);
//! the crate root names them all for users (`LockGuard<MemoryBackend>`, ...).

pub(crate) mod memory;
pub(crate) mod redis;

pub(crate) use memory::MemoryBackend;
pub(crate) use redis::RedisBackend;
