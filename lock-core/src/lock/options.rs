//! Per-call choices of a lock acquisition.

use std::sync::Arc;
use std::time::Duration;

use crate::client::config::Lease;
use crate::client::store::key::LockMode;
use crate::metrics::Primitive;
use crate::owner::LockScope;

/// Per-call choices for [`LockClient::acquire`](crate::LockClient::acquire); anything not
/// set falls back to the client's [`LockConfig`](crate::LockConfig).
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Lease, LockOptions};
///
/// let opts = LockOptions::new()
///     .lease(Lease::Fixed(Duration::from_secs(5)))
///     .wait(Duration::ZERO); // do not wait: fail with `Busy` at once
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    pub(crate) lease: Option<Lease>,
    pub(crate) wait: Option<Duration>,
    pub(crate) scope: Option<LockScope>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) delimiter: Option<&'static str>,
    pub(crate) fenced: bool,
    pub(crate) fair: bool,
    pub(crate) mode: LockMode,
    pub(crate) value: Option<Arc<[u8]>>,
    /// What the hold is for, when not a lock of its mode (an election's campaign): the
    /// metrics' label.
    pub(crate) primitive: Option<Primitive>,
}

impl LockOptions {
    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// Lease of this lock. Default: the client's.
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Wait budget; zero means fail at once with [`LockError::Busy`](crate::LockError::Busy). Default: the client's.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Owner scope for reentrancy. Default: the task's current [`LockScope`], if any,
    /// else a fresh owner (not reentrant).
    pub fn scope(mut self, scope: &LockScope) -> Self {
        self.scope = Some(scope.clone());
        self
    }

    /// Joins the parts of this lock's name. Default: the client's
    /// ([`LockConfig::with_delimiter`](crate::LockConfig::with_delimiter)). The same name with another delimiter is another
    /// lock.
    pub fn delimiter(mut self, delimiter: &'static str) -> Self {
        self.delimiter = Some(delimiter);
        self
    }

    /// Cap on total hold time under the watchdog. Default: the client's.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Takes the grant's fencing token with the grant, in the same script call. By
    /// default a lock is taken with a plain `SET NX PX` (what the raw recipe costs) and
    /// its token only when asked for ([`LockGuard::fence`](crate::LockGuard::fence), one
    /// more round trip); ask here when every holder writes with a token.
    pub fn fenced(mut self) -> Self {
        self.fenced = true;
        self
    }

    /// Waits in line: the lock goes to its waiters in the order they first asked, not
    /// to whichever asks first after a release. A waiter that leaves (a timeout, a
    /// cancelled future) gives up its place at once; one that vanishes (a crash, a
    /// partition) holds the line up for at most one place lease after its last attempt
    /// (the backoff's longest sleep plus the command timeout: 3 s by default).
    ///
    /// ```no_run
    /// # async fn f(locks: &lock_core::MemoryLocks) -> Result<(), lock_core::LockError> {
    /// use lock_core::LockOptions;
    ///
    /// let turn = locks.acquire("printer", LockOptions::new().fair()).await?;
    /// // ... the next waiter in line gets it when this guard goes ...
    /// turn.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// On Redis and in memory a fair lock is the plain lock of its name with a queue
    /// beside it: an acquisition without `fair` does not queue and may take the lock
    /// before the waiters in line, so take a name fair everywhere or nowhere.
    /// ZooKeeper, etcd, PostgreSQL and MySQL grant every lock in arrival order, fair or
    /// not. Redlock, and read-write locks on Redis and in memory, have no line
    /// ([`LockError::Unsupported`](crate::LockError::Unsupported)).
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// Takes a read hold of the name's read-write lock: shared with other readers,
    /// never with a writer. Its guard has no fencing token (readers write nothing), so
    /// it cannot be [`fenced`](Self::fenced).
    ///
    /// ```no_run
    /// # async fn f(locks: &lock_core::MemoryLocks) -> Result<(), lock_core::LockError> {
    /// use lock_core::LockOptions;
    ///
    /// let reading = locks.acquire("catalog", LockOptions::new().read()).await?;
    /// // ... read; a writer waits until every reader is gone ...
    /// reading.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Not every store has shared holds: see [`LockError::Unsupported`](crate::LockError::Unsupported).
    pub fn read(self) -> Self {
        self.mode(LockMode::Read)
    }

    /// Takes the write hold of the name's read-write lock: alone, with no reader. Once
    /// a writer waits, new readers wait too (see the README's read-write lock section).
    /// The scope holding it may also take a read hold (a downgrade); a scope holding a
    /// read hold cannot take the write hold ([`LockError::Upgrade`](crate::LockError::Upgrade)).
    pub fn write(self) -> Self {
        self.mode(LockMode::Write)
    }

    /// The kind of hold to take. Default: [`LockMode::Exclusive`], a plain lock.
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// A value the store keeps beside this hold, for others to read while it is held:
    /// on etcd the contender key's value, as Go's `Election.Campaign(ctx, value)`
    /// writes it (read the holder's with `EtcdLocks::holder`). A scope that re-enters a
    /// hold keeps the value it was granted with.
    ///
    /// Stores that keep no value beside a hold refuse it
    /// ([`LockError::Unsupported`](crate::LockError::Unsupported)).
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into().into());
        self
    }
}
