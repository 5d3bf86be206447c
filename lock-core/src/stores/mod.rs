//! Lock stores other than Redis, behind the same [`DistributedLock`](crate::DistributedLock)
//! trait and the same guard ([`StoreGuard`]): the in-memory store (always built), and
//! the database and ZooKeeper stores behind their cargo features.

pub(crate) mod memory;
pub(crate) mod session;

pub use memory::MemoryLocks;
pub use session::StoreGuard;
