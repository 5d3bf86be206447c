//! [`RedissonLocks`]: locks in Redisson's layout on a [`LockClient`]'s deployment, so
//! Rust and Java services share them.

use std::time::Duration;

use super::locks::Locks;
use crate::backends::RedissonBackend;
use crate::facade::LockClient;
use crate::lock::LockGuard;

/// The guard of a [`RedissonLocks`] lock.
pub type RedissonGuard = LockGuard<RedissonBackend>;

/// Locks in the layout of Redisson (Java), on the Redis node or Cluster of a
/// [`LockClient`]: a Java service locking `redisson.getLock(name)`,
/// `getFairLock(name)` or `getReadWriteLock(name)` and a Rust service locking the same
/// name here exclude each other, and each one's release wakes the other's waiters.
///
/// - The name is the key, as Redisson's: the parts joined with the config's delimiter,
///   without the namespace (`("order", 42)` is the Java name `"order:42"`; a part's
///   `{`, `}`, `%` and delimiter are percent-escaped, so a Java name with a hash tag of
///   its own cannot be named here).
/// - A hold is the field `<client uuid>:<thread id>` of the lock's hash: the client's
///   id written as a UUID, the [`LockScope`](crate::LockScope) as the thread.
/// - [`LockOptions::fair`](crate::LockOptions::fair) takes `RFairLock`'s queue, and a
///   waiter that vanished holds it up for at most the fair wait
///   ([`with_fair_wait`](Self::with_fair_wait), Redisson's `fairLockWaitTimeout`, 5
///   minutes by default) after the waiter before it; [`read`](crate::LockOptions::read)
///   and [`write`](crate::LockOptions::write) take `RReadWriteLock`'s holds: readers are
///   not held back by a waiting writer, as in Redisson.
/// - Fencing tokens count in `redisson_lock_token:{name}`, `RFencedLock`'s counter.
/// - Everything else is the engine's: the same guard, watchdog (30 s lease renewed
///   every 10 s, Redisson's defaults), loss signal and release results as
///   [`LockClient`]'s own locks.
///
/// Matches Redisson 3.24 and newer (the unlock latch); see the README's Redisson
/// section for what differs in older versions.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockClient, LockOptions, RedissonLocks};
///
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// let locks = RedissonLocks::new(&client);
/// // What a Java service takes with `redisson.getLock("order:42").lock()`.
/// let guard = locks.lock(("order", 42_u64)).await?;
/// guard.release().await?;
/// let reader = locks.acquire("catalog", LockOptions::new().read()).await?;
/// reader.release().await?;
/// # Ok(()) }
/// ```
pub type RedissonLocks = Locks<RedissonBackend>;

impl Locks<RedissonBackend> {
    /// Locks in Redisson's layout on `client`'s connection, pub/sub hub and config.
    /// Keep one per client: its registry of holds is its own.
    pub fn new(client: &LockClient) -> Self {
        let redis = client.inner.backend.client().clone();
        Self::over(RedissonBackend::new(redis))
    }

    /// These locks with `wait` as a fair waiter's wait time: a place in a fair lock's
    /// queue lapses this long after the place before it (or after the holder's lease,
    /// first in line) unless the waiter is granted before. Redisson's
    /// `fairLockWaitTimeout`; every client of one lock should use the same.
    pub fn with_fair_wait(self, wait: Duration) -> Self {
        Self::over(self.backend().with_fair_wait(wait))
    }

    /// The fair wait in force ([`with_fair_wait`](Self::with_fair_wait)).
    pub fn fair_wait(&self) -> Duration {
        self.backend().fair_wait()
    }
}
