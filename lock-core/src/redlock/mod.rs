//! `Redlock`: one lock over N independent Redis masters, granted by a majority: the
//! lock engine over [`RedlockBackend`], a backend made of N Redis backends plus the
//! quorum arithmetic (pure functions in [`quorum`], with the one fan-out helper
//! [`quorum::each_within`]). Each node runs the single-node grant protocol (a value per
//! grant, lease, release message); the engine keeps reentrancy, the lease clock, the
//! renewals (one call per node per batch) and the lost signal, as for one node.

mod backend;
mod quorum;

use std::time::Duration;

use redis::IntoConnectionInfo;

pub use backend::RedlockBackend;

use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockKeys, LockName};
use crate::error::LockError;
use crate::facade::LockClient;
use crate::lock::LockGuard;
use crate::stores::locks::Locks;

/// The default per-node time limit of one Redlock request.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// A lock over N independent Redis masters (the Redlock algorithm), with the same
/// guard as every store ([`RedlockGuard`] is `LockGuard<RedlockBackend>`): reentrancy
/// per [`LockScope`](crate::LockScope), fixed or watchdog-renewed leases,
/// [`LockGuard::lost`], and distinct release results.
///
/// Behavior:
/// - **Acquire** asks every node in parallel, each within the per-node timeout
///   ([`with_node_timeout`](Self::with_node_timeout), default 200 ms; keep it small
///   against the lease). It is granted when a quorum of N/2 + 1 nodes granted and some
///   validity is left: validity = lease - elapsed - drift, drift = lease x 0.01 + 2 ms,
///   elapsed measured on the monotonic clock from before the first request to the last
///   answer. Otherwise every node that granted is released at once (the nodes that did
///   not answer in time release in the background), and the attempt is retried with
///   jittered backoff inside the wait budget; waiters also wake on the release message
///   of a node that answered.
/// - **Errors** say how many nodes agreed and how many were needed
///   ([`LockError::NoQuorum`]); a quorum granted too late gives
///   [`LockError::ValidityExhausted`]; a lock held by another owner gives
///   [`LockError::Busy`] / [`LockError::Timeout`] as on one node.
/// - **Renewal**: the watchdog renews every copy (one call per node per batch, each
///   within the per-node timeout, so a paused node does not hold up the others'
///   answers); the lock counts as lost (and [`LockGuard::lost`] resolves) as soon as more than
///   N - quorum copies are lost, or when no quorum confirmed it before its validity ran
///   out. [`LockGuard::extend`] and [`LockGuard::release`] need a quorum too.
/// - **Fencing tokens are not promised across nodes**: each node has its own counter,
///   and the nodes of two successive grants may differ, so no combination of them is
///   guaranteed to grow. [`LockGuard::fence`] takes the token of one designated node
///   (the first), present only when that node granted and still holds its copy (else
///   [`LockError::NoFencingToken`]): sound as long as that node never loses its
///   counter (persistence with `appendfsync always`).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockConfig, Redlock};
///
/// let redlock = Redlock::open(
///     [
///         "redis://10.0.0.1:6379/",
///         "redis://10.0.0.2:6379/",
///         "redis://10.0.0.3:6379/",
///         "redis://10.0.0.4:6379/",
///         "redis://10.0.0.5:6379/",
///     ],
///     LockConfig::new(),
/// )?;
/// let guard = redlock.lock(("order", 42_u64)).await?; // 3 of 5 must grant
/// tokio::select! {
///     biased; // the loss first, should both be ready after a pause
///     _ = guard.lost() => { /* a majority of the copies is gone: stop */ }
///     _ = async { /* the critical section */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub type Redlock = Locks<RedlockBackend>;

/// The guard of a [`Redlock`] lock: the engine's guard over the quorum.
pub type RedlockGuard = LockGuard<RedlockBackend>;

impl Locks<RedlockBackend> {
    /// A Redlock over `nodes`, one [`LockClient`] per independent master. Lease, wait
    /// budget, backoff and namespace come from the first node's [`LockConfig`]; each
    /// node keeps its own namespace for its keys.
    pub fn new(nodes: Vec<LockClient>) -> Result<Self, LockError> {
        Self::with_nodes(nodes, DEFAULT_NODE_TIMEOUT)
    }

    fn with_nodes(nodes: Vec<LockClient>, node_timeout: Duration) -> Result<Self, LockError> {
        let Some(first) = nodes.first() else {
            return Err(LockError::InvalidConfig(
                "a Redlock needs at least one node (3 or 5 independent masters are usual)".into(),
            ));
        };
        let config = first.config().clone();
        Ok(Self::over(RedlockBackend::new(nodes, config, node_timeout)))
    }

    /// Opens one [`LockClient`] per URL with `config` (lazily: a node that is down now
    /// is tried again on every call) and builds the Redlock over them; like
    /// [`LockClient::open_lazy`], inside a tokio runtime.
    pub fn open<I>(urls: I, config: LockConfig) -> Result<Self, LockError>
    where
        I: IntoIterator,
        I::Item: IntoConnectionInfo,
    {
        let nodes = urls
            .into_iter()
            .map(|url| LockClient::open_lazy(url, config.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(nodes)
    }

    /// Sets the time limit of each node's answer (default 200 ms). It bounds how long
    /// a dead or paused node can delay an acquisition, and it eats into the validity.
    /// Set it before taking locks: this makes a new Redlock over the same nodes.
    pub fn with_node_timeout(self, timeout: Duration) -> Result<Self, LockError> {
        if timeout.is_zero() {
            return Err(LockError::InvalidConfig(
                "the Redlock per-node timeout must be above zero".into(),
            ));
        }
        Self::with_nodes(self.backend().clients.clone(), timeout)
    }

    /// Nodes that must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.backend().nodes.len())
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[LockClient] {
        &self.backend().clients
    }

    /// The per-node time limit.
    pub fn node_timeout(&self) -> Duration {
        self.backend().node_timeout
    }

    /// The Redis keys of the lock `name` on each node, in node order (each node may
    /// have its own namespace).
    pub fn keys<N: LockName>(&self, name: N) -> Result<Vec<LockKeys>, LockError> {
        let delimiter = &self.config().delimiter;
        self.nodes()
            .iter()
            .map(|n| key::lock_keys(&n.config().namespace, delimiter, &name))
            .collect()
    }
}

impl LockGuard<RedlockBackend> {
    /// The owner id (client id and scope) of the first copy.
    pub fn owner(&self) -> &str {
        let value = self.record().nodes.iter().flatten().next();
        value.map_or("", |c| crate::backends::redis::owner_of(&c.value))
    }

    /// Copies known to be held now (at most the number of nodes).
    pub fn copies(&self) -> usize {
        self.record().held()
    }

    /// The nodes that granted this lock, in node order.
    pub fn granted_nodes(&self) -> Vec<usize> {
        let nodes = self.record().nodes.iter().enumerate();
        nodes.filter_map(|(i, c)| c.as_ref().map(|_| i)).collect()
    }
}
