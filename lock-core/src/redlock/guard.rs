//! `RedlockGuard`: a lock held on a quorum of independent masters.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::quorum::{self, ReleaseTally, ReleaseVerdict, each_within};
use crate::error::LockError;
use crate::lock::LockGuard;
use crate::lock::Released;
use crate::lock::release_outcome;
use crate::metrics::{self, StoreKind};
use crate::owner::FencingToken;

/// A lock held on a quorum of a [`Redlock`](crate::Redlock)'s nodes.
///
/// The same API as [`LockGuard`], with quorum rules:
/// - [`release`](Self::release) gives back every copy in parallel; the result is that
///   of a quorum of nodes ([`Released::Unlocked`], [`Released::StillHeld`],
///   [`LockError::Expired`] / [`LockError::NotOwner`]), else
///   [`LockError::NoQuorum`]. Dropping the guard releases every copy in the
///   background.
/// - [`lost`](Self::lost) resolves, and [`is_held`](Self::is_held) turns false, once
///   more than N - quorum copies are lost (renewal refused or failed until the lease
///   ran out, or the fixed lease passed).
/// - [`valid_for`](Self::valid_for) is the time the quorum's copies are known to last,
///   less the clock drift allowance.
/// - [`fencing_token`](Self::fencing_token) is only the designated (first) node's token;
///   see [`Redlock`](crate::Redlock) for why no cross-node token is offered.
#[must_use = "dropping a RedlockGuard releases the lock at once"]
pub struct RedlockGuard {
    name: String,
    /// One slot per node, in node order: the copy this guard holds there, if any.
    nodes: Vec<Option<LockGuard>>,
    quorum: usize,
    drift: Duration,
    node_timeout: Duration,
    /// When the quorum granted it (for the hold time).
    granted: Instant,
}

impl std::fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("lock", &self.name)
            .field("copies", &self.copies())
            .field("quorum", &self.quorum)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl RedlockGuard {
    pub(super) fn new(
        name: String,
        nodes: Vec<Option<LockGuard>>,
        quorum: usize,
        drift: Duration,
        node_timeout: Duration,
    ) -> Self {
        Self {
            name,
            nodes,
            quorum,
            drift,
            node_timeout,
            granted: Instant::now(),
        }
    }

    /// The lock's name as stored (parts escaped and joined).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The owner id this guard holds the lock as on the first node that granted it
    /// (each node's client has its own id; the scope is the same on every node).
    pub fn owner(&self) -> &str {
        self.nodes
            .iter()
            .flatten()
            .next()
            .map_or("", LockGuard::owner)
    }

    /// Nodes on which this guard holds a copy that is not known to be lost.
    pub fn copies(&self) -> usize {
        self.nodes.iter().flatten().filter(|g| g.is_held()).count()
    }

    /// Which nodes (by index) granted this guard a copy at acquisition.
    pub fn granted_nodes(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, g)| g.as_ref().map(|_| i))
            .collect()
    }

    /// The fencing token of the designated node (the first), if it granted this lock and
    /// the token was taken (acquired with [`LockOptions::fenced`](crate::LockOptions::fenced),
    /// or by [`fence`](Self::fence)). Tokens of different nodes are unrelated; never
    /// compare them.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.designated().and_then(LockGuard::fencing_token)
    }

    /// The designated node's fencing token, taken now if it was not yet (see
    /// [`LockGuard::fence`]); `None` when the designated node did not grant this lock.
    pub async fn fence(&self) -> Result<Option<FencingToken>, LockError> {
        match self.designated() {
            Some(g) => g.fence().await.map(Some),
            None => Ok(None),
        }
    }

    fn designated(&self) -> Option<&LockGuard> {
        self.nodes.first().and_then(Option::as_ref)
    }

    /// True while a quorum of copies is known to be in force.
    pub fn is_held(&self) -> bool {
        !self.valid_for().is_zero()
    }

    /// How long a quorum of copies is known to last from now, less the drift allowance
    /// (zero once fewer than a quorum are held).
    pub fn valid_for(&self) -> Duration {
        // Each copy's lease was measured from before its request; the quorum lasts as
        // long as its quorum-th longest copy.
        let copies = self.nodes.iter().flatten().map(LockGuard::valid_for);
        quorum::quorum_validity(copies.collect(), self.quorum, self.drift)
    }

    /// Resolves once more than N - quorum copies are lost. Never resolves while a
    /// quorum holds, so race it against the critical section.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let tolerated = self.nodes.len().saturating_sub(self.quorum);
        let missing = self.nodes.iter().filter(|g| g.is_none()).count();
        let mut copies: FuturesUnordered<_> =
            self.nodes.iter().flatten().map(LockGuard::lost).collect();
        async move {
            let mut lost = missing;
            while lost <= tolerated {
                match copies.next().await {
                    Some(()) => lost += 1,
                    // Every copy lost (cannot be reached while `lost <= tolerated` unless
                    // the guard held fewer copies than the quorum).
                    None => return,
                }
            }
        }
    }

    /// Gives back every copy; the answer of a quorum decides the result.
    pub async fn release(mut self) -> Result<Released, LockError> {
        let timeout = self.node_timeout;
        let nodes = self.nodes.len();
        // Each copy is released in its own task, so the answer can come as soon as a
        // quorum agrees; the slower copies finish in the background.
        let mut answers: FuturesUnordered<_> = self
            .nodes
            .iter_mut()
            .enumerate()
            .filter_map(|(i, g)| g.take().map(|g| (i, g)))
            .map(|(i, g)| {
                let task = tokio::spawn(tokio::time::timeout(timeout, g.release()));
                async move { (i, task.await) }
            })
            .collect();
        let copies = answers.len();
        let mut tally = ReleaseTally::default();
        let mut cause = None;
        let verdict = loop {
            if let Some(verdict) = tally.verdict(nodes, copies) {
                break verdict;
            }
            let Some((i, answer)) = answers.next().await else {
                // Unreachable: every copy answered means a verdict.
                break ReleaseVerdict::NoQuorum;
            };
            let failure = match answer {
                Ok(Ok(Ok(Released::StillHeld { holds_left }))) => {
                    tally.still_held.push(holds_left);
                    None
                }
                Ok(Ok(Ok(_))) => {
                    tally.unlocked += 1;
                    None
                }
                Ok(Ok(Err(e))) if e.is_not_owner() => {
                    tally.taken += 1;
                    None
                }
                Ok(Ok(Err(e))) if e.is_expired() => {
                    tally.expired += 1;
                    None
                }
                Ok(Ok(Err(e))) => Some(format!("copy {i}: {e}")),
                Ok(Err(_)) => Some(format!("copy {i}: no answer within {timeout:?}")),
                Err(e) => Some(format!("copy {i}: release task failed: {e}")),
            };
            if let Some(failure) = failure {
                tally.failed += 1;
                cause.get_or_insert(failure);
            }
        };
        let key = self.name.clone();
        let result = match verdict {
            ReleaseVerdict::Unlocked => Ok(Released::Unlocked),
            ReleaseVerdict::StillHeld { holds_left } => Ok(Released::StillHeld { holds_left }),
            ReleaseVerdict::NotOwner => Err(LockError::NotOwner { key }),
            ReleaseVerdict::Expired => Err(LockError::Expired { key }),
            ReleaseVerdict::NoQuorum => Err(LockError::NoQuorum {
                key,
                op: "release",
                granted: tally.unlocked + tally.still_held.len(),
                needed: self.quorum,
                nodes,
                cause,
            }),
        };
        let last = !matches!(result, Ok(Released::StillHeld { .. }));
        let held = last.then(|| self.granted.elapsed());
        metrics::release(StoreKind::Redlock, release_outcome(&result), held);
        result
    }

    /// Sets the lease of every copy to `lease` from now; needs a quorum.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        let start = Instant::now();
        let timeout = self.node_timeout;
        let copies = self.nodes.iter().flatten();
        let answers = each_within(timeout, copies, |g| g.extend(lease)).await;
        let mut ok = 0;
        let mut cause = None;
        for answer in answers {
            match answer {
                Ok(Ok(())) => ok += 1,
                Ok(Err(e)) => {
                    cause.get_or_insert_with(|| e.to_string());
                }
                Err(_) => {
                    cause.get_or_insert_with(|| format!("no answer within {timeout:?}"));
                }
            }
        }
        if quorum::extended(self.nodes.len(), ok, lease, start.elapsed()) {
            return Ok(());
        }
        Err(LockError::NoQuorum {
            key: self.name.clone(),
            op: "extend",
            granted: ok,
            needed: self.quorum,
            nodes: self.nodes.len(),
            cause,
        })
    }

    /// Takes the same lock again as the same owner on every node that holds a copy (a
    /// re-entered hold; no waiting); needs a quorum.
    pub async fn reenter(&self) -> Result<RedlockGuard, LockError> {
        let started = Instant::now();
        let result = self.reenter_copies().await;
        let outcome = metrics::Acquired::of(&result, true);
        metrics::acquired(StoreKind::Redlock, outcome, started.elapsed());
        result
    }

    async fn reenter_copies(&self) -> Result<RedlockGuard, LockError> {
        let timeout = self.node_timeout;
        // Nodes without a copy answer `None` at once.
        let answers = each_within(timeout, &self.nodes, |g| async move {
            match g {
                Some(g) => Some(g.reenter().await),
                None => None,
            }
        })
        .await;
        let mut cause = None;
        let nodes: Vec<Option<LockGuard>> = answers
            .into_iter()
            .map(|a| match a {
                Ok(Some(Ok(g))) => Some(g),
                Ok(Some(Err(e))) => {
                    cause.get_or_insert_with(|| e.to_string());
                    None
                }
                Err(_) => {
                    cause.get_or_insert_with(|| format!("no answer within {timeout:?}"));
                    None
                }
                Ok(None) => None,
            })
            .collect();
        let granted = nodes.iter().flatten().count();
        if granted < self.quorum {
            // Dropping the copies we got gives them back.
            return Err(LockError::NoQuorum {
                key: self.name.clone(),
                op: "reenter",
                granted,
                needed: self.quorum,
                nodes: nodes.len(),
                cause,
            });
        }
        Ok(RedlockGuard {
            name: self.name.clone(),
            nodes,
            quorum: self.quorum,
            drift: self.drift,
            node_timeout: self.node_timeout,
            granted: self.granted,
        })
    }

    /// Lets every copy run out on its own (no release, no renewal): an anti-resubmit
    /// window, as [`LockGuard::hold_until_expiry`].
    pub fn hold_until_expiry(mut self) {
        for guard in self.nodes.iter_mut().filter_map(Option::take) {
            guard.hold_until_expiry();
        }
    }
}
