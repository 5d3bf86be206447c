//! `Redlock`: one lock over N independent Redis masters, granted by a majority.
//!
//! Each node is an ordinary [`LockClient`], so every node runs the same grant
//! protocol as a single-node lock (a value per grant, lease, release message) and keeps
//! its own watchdog; this module adds the quorum on top: parallel fan-out with a
//! per-node timeout ([`quorum::each_within`]), the verdicts (pure functions in
//! [`quorum`]), and the aggregate lost signal.

mod guard;
mod quorum;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::IntoConnectionInfo;

pub use guard::RedlockGuard;

use crate::client::config::LockConfig;
use crate::client::in_span;
use crate::client::store::key::{self, LockKeys, LockName};
use crate::client::wait::{Listen, Turn, wait_for_turn};
use crate::error::LockError;
use crate::facade::LockClient;
use crate::lock::LockGuard;
use crate::lock::LockOptions;
use crate::lock::{Request, Resolved};
use crate::metrics::{self, StoreKind};

/// The default per-node time limit of one Redlock request.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// A lock over N independent Redis masters (the Redlock algorithm), with the same
/// guard API as [`LockClient`]: reentrancy per [`LockScope`](crate::LockScope), fixed or
/// watchdog-renewed leases, [`RedlockGuard::lost`], and distinct release results.
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
/// - **Renewal**: each node's watchdog renews its copy; the lock counts as lost (and
///   [`RedlockGuard::lost`] resolves) as soon as more than N - quorum copies are lost.
///   [`RedlockGuard::extend`] and [`RedlockGuard::release`] need a quorum too.
/// - **Fencing tokens are not promised across nodes**: each node has its own counter,
///   and the nodes of two successive grants may differ, so no combination of them is
///   guaranteed to grow. [`RedlockGuard::fence`] takes the token of one designated
///   node (the first), present only when that node granted: sound as long as that node
///   never loses its counter (persistence with `appendfsync always`), and a grant
///   without it has no token to write with.
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
///     _ = guard.lost() => { /* a majority of the copies is gone: stop */ }
///     _ = async { /* the critical section */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<LockClient>,
    config: LockConfig,
    node_timeout: Duration,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.inner.nodes.len())
            .field("quorum", &self.quorum())
            .field("node_timeout", &self.inner.node_timeout)
            .finish_non_exhaustive()
    }
}

/// What the nodes answered to one acquire attempt.
struct Round {
    guards: Vec<Option<LockGuard>>,
    granted: usize,
    /// Nodes that answered "held by another owner", and the shortest remaining lease.
    busy: usize,
    retry_after: Option<Duration>,
    /// A node that answered (for the release subscription).
    answered: Option<usize>,
    cause: Option<String>,
    elapsed: Duration,
}

impl Redlock {
    /// A Redlock over `nodes`, one [`LockClient`] per independent master. Lease, wait
    /// budget, backoff and namespace come from the first node's [`LockConfig`]; give
    /// every node the same config (each node's watchdog renews on its own period).
    pub fn new(nodes: Vec<LockClient>) -> Result<Self, LockError> {
        let Some(first) = nodes.first() else {
            return Err(LockError::InvalidConfig(
                "a Redlock needs at least one node (3 or 5 independent masters are usual)".into(),
            ));
        };
        let config = first.config().clone();
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                nodes,
                node_timeout: DEFAULT_NODE_TIMEOUT,
            }),
        })
    }

    /// Opens one [`LockClient`] per URL with `config` (lazily: a node that is down now
    /// is tried again on every call) and builds the Redlock over them.
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
    pub fn with_node_timeout(mut self, timeout: Duration) -> Result<Self, LockError> {
        if timeout.is_zero() {
            return Err(LockError::InvalidConfig(
                "the Redlock per-node timeout must be above zero".into(),
            ));
        }
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.node_timeout = timeout,
            None => {
                let i = &self.inner;
                self.inner = Arc::new(Inner {
                    nodes: i.nodes.clone(),
                    config: i.config.clone(),
                    node_timeout: timeout,
                });
            }
        }
        Ok(self)
    }

    /// Nodes that must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.inner.nodes.len())
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[LockClient] {
        &self.inner.nodes
    }

    /// The per-node time limit.
    pub fn node_timeout(&self) -> Duration {
        self.inner.node_timeout
    }

    /// Takes the lock if a quorum grants it now; [`LockError::Busy`] if another owner
    /// holds it.
    pub async fn try_lock<N: LockName>(&self, name: N) -> Result<RedlockGuard, LockError> {
        self.acquire(name, LockOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Takes the lock, retrying within the config's wait budget.
    pub async fn lock<N: LockName>(&self, name: N) -> Result<RedlockGuard, LockError> {
        self.acquire(name, LockOptions::new()).await
    }

    /// Takes the lock with per-call options (lease, wait, scope, delimiter, max hold).
    pub async fn acquire<N: LockName>(
        &self,
        name: N,
        options: LockOptions,
    ) -> Result<RedlockGuard, LockError> {
        let resolved = Resolved::new(&self.inner.config, options)?;
        let requests = self
            .inner
            .nodes
            .iter()
            .map(|n| {
                let mut request = resolved.request(&n.config().namespace, &name)?;
                request.part_of = Some(StoreKind::Redlock);
                Ok(request)
            })
            .collect::<Result<Vec<_>, LockError>>()?;
        let wait = resolved.wait;
        let span = tracing::debug_span!("redlock.acquire", lock = %requests[0].keys.name, ?wait);
        let started = Instant::now();
        let result = in_span(span, self.acquire_requests(requests, wait)).await;
        let outcome = metrics::Acquired::of(&result, false);
        metrics::acquired(StoreKind::Redlock, outcome, started.elapsed());
        result
    }

    async fn acquire_requests(
        &self,
        requests: Vec<Request>,
        wait: Duration,
    ) -> Result<RedlockGuard, LockError> {
        let started = Instant::now();
        let deadline = started
            .checked_add(wait)
            .unwrap_or(started + crate::client::config::MAX_LEASE);
        let lease = requests[0].lease;
        let name = requests[0].keys.name.clone();
        // The first node that answered: its release message wakes us.
        let answered = std::sync::atomic::AtomicUsize::new(usize::MAX);
        let last = std::sync::Mutex::new(None::<Failure>);
        let channels: Vec<std::sync::OnceLock<String>> = requests
            .iter()
            .map(|_| std::sync::OnceLock::new())
            .collect();
        let listen = || {
            let i = answered.load(std::sync::atomic::Ordering::Relaxed);
            let node = self.inner.nodes.get(i)?;
            let channel = channels[i].get_or_init(|| requests[i].keys.channel());
            Some(Listen::Hub(node.client().hub(), channel.as_str()))
        };
        let turn = wait_for_turn(
            &self.inner.config.backoff,
            listen,
            deadline.into(),
            |_| async {
                let round = self.round(&requests).await;
                match self.judge(round, lease, &name).await {
                    Ok(guard) => Ok(Turn::Done(guard)),
                    Err(failure) => {
                        if let Some(i) = failure.answered {
                            let _ = answered.compare_exchange(
                                usize::MAX,
                                i,
                                std::sync::atomic::Ordering::Relaxed,
                                std::sync::atomic::Ordering::Relaxed,
                            );
                        }
                        let hint = failure.retry_after.unwrap_or(Duration::MAX);
                        *last.lock().unwrap_or_else(|e| e.into_inner()) = Some(failure);
                        Ok(Turn::Retry(hint))
                    }
                }
            },
        )
        .await?;
        match turn {
            Ok(guard) => {
                tracing::debug!(lock = %name, waited = ?started.elapsed(), valid_for = ?guard.valid_for(), "redlock granted");
                Ok(guard)
            }
            Err(_) => {
                let failure = last.into_inner().unwrap_or_else(|e| e.into_inner());
                Err(match failure {
                    Some(f) => f.into_error(wait, started.elapsed()),
                    None => LockError::Timeout {
                        key: name,
                        waited: started.elapsed(),
                    },
                })
            }
        }
    }

    /// One attempt: every node in parallel, each within the node timeout.
    async fn round(&self, requests: &[Request]) -> Round {
        let timeout = self.inner.node_timeout;
        let started = Instant::now();
        // An answer that comes too late is dropped mid-request; the node client then
        // undoes the possible grant in the background.
        let answers = quorum::each_within(
            timeout,
            self.inner.nodes.iter().zip(requests),
            |(node, req)| node.inner.acquire(req, Duration::ZERO),
        )
        .await;
        let elapsed = started.elapsed();
        let mut round = Round {
            guards: Vec::with_capacity(answers.len()),
            granted: 0,
            busy: 0,
            retry_after: None,
            answered: None,
            cause: None,
            elapsed,
        };
        for (i, answer) in answers.into_iter().enumerate() {
            let guard = match answer {
                Ok(Ok(guard)) => {
                    round.granted += 1;
                    round.answered.get_or_insert(i);
                    Some(guard)
                }
                Ok(Err(LockError::Busy { retry_after, .. })) => {
                    round.busy += 1;
                    round.answered.get_or_insert(i);
                    round.retry_after = Some(
                        round
                            .retry_after
                            .map_or(retry_after, |r| r.min(retry_after)),
                    );
                    None
                }
                Ok(Err(e)) => {
                    round.cause.get_or_insert_with(|| format!("node {i}: {e}"));
                    None
                }
                Err(_) => {
                    round
                        .cause
                        .get_or_insert_with(|| format!("node {i}: no answer within {timeout:?}"));
                    None
                }
            };
            round.guards.push(guard);
        }
        round
    }

    /// Grants the round's guards as one Redlock guard, or gives them back.
    async fn judge(
        &self,
        round: Round,
        lease: Duration,
        name: &str,
    ) -> Result<RedlockGuard, Failure> {
        let nodes = self.inner.nodes.len();
        let verdict =
            quorum::acquire_verdict(nodes, round.granted, round.busy, lease, round.elapsed);
        if let quorum::Acquired::Granted { .. } = verdict {
            return Ok(RedlockGuard::new(
                name.to_owned(),
                round.guards,
                self.quorum(),
                drift(lease),
                self.inner.node_timeout,
            ));
        }
        // Give back every copy we got before trying again, so that our own next attempt
        // cannot race with these releases.
        let copies = round.guards.into_iter().flatten();
        quorum::each_within(self.inner.node_timeout, copies, LockGuard::release).await;
        tracing::debug!(lock = %name, granted = round.granted, needed = self.quorum(), busy = round.busy, elapsed = ?round.elapsed, "redlock attempt failed");
        Err(Failure {
            key: name.to_owned(),
            verdict,
            nodes,
            granted: round.granted,
            retry_after: round.retry_after,
            answered: round.answered,
            cause: round.cause,
            elapsed: round.elapsed,
            lease,
        })
    }
}

pub(crate) use crate::client::config::drift;

/// Why an attempt did not grant.
struct Failure {
    key: String,
    verdict: quorum::Acquired,
    nodes: usize,
    granted: usize,
    retry_after: Option<Duration>,
    answered: Option<usize>,
    cause: Option<String>,
    elapsed: Duration,
    lease: Duration,
}

impl Failure {
    fn into_error(self, wait: Duration, waited: Duration) -> LockError {
        match self.verdict {
            quorum::Acquired::TooLate => LockError::ValidityExhausted {
                key: self.key,
                elapsed: self.elapsed,
                lease: self.lease,
            },
            quorum::Acquired::Contended if wait.is_zero() => LockError::Busy {
                key: self.key,
                retry_after: self.retry_after.unwrap_or_default(),
            },
            quorum::Acquired::Contended => LockError::Timeout {
                key: self.key,
                waited,
            },
            quorum::Acquired::NoQuorum | quorum::Acquired::Granted { .. } => LockError::NoQuorum {
                key: self.key,
                op: "acquire",
                granted: self.granted,
                needed: quorum::quorum(self.nodes),
                nodes: self.nodes,
                cause: self.cause,
            },
        }
    }
}

impl Redlock {
    /// The Redis keys of the lock `name` on each node, in node order (each node may
    /// have its own namespace).
    pub fn keys<N: LockName>(&self, name: N) -> Result<Vec<LockKeys>, LockError> {
        let delimiter = &self.inner.config.delimiter;
        self.inner
            .nodes
            .iter()
            .map(|n| key::lock_keys(&n.config().namespace, delimiter, &name))
            .collect()
    }
}
