//! Per-call choices of a lock acquisition.

use std::time::Duration;

use crate::client::config::Lease;
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
}
