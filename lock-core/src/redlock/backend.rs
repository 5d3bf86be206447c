//! `RedlockBackend`: the engine's seam over N Redis backends plus the quorum
//! arithmetic of [`quorum`](super::quorum). A grant is one copy per node that granted
//! (each an ordinary single-node grant, with its own value); every seam call fans out
//! to the nodes within the per-node timeout and counts their answers. The engine above
//! keeps reentrancy, the lease clock, renewals and the lost signal, as for one node.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::time::Instant;

use super::quorum::{self, Acquired, ReleaseTally, ReleaseVerdict, each_within};
use crate::backends::RedisBackend;
use crate::client::config::{LockConfig, drift, proven};
use crate::client::store::key::{self, LockKeys};
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::facade::LockClient;
use crate::lock::Request;
use crate::lock::registry::Loss;
use crate::lock::seam::{Backend, Capabilities, Held, Renewed, Seam, Taken, Validity};
use crate::metrics::StoreKind;
use crate::owner::FencingToken;

/// Locks over N independent Redis masters: the backend of
/// [`Redlock`](crate::Redlock), whose guards are [`RedlockGuard`](crate::RedlockGuard)
/// (`LockGuard<RedlockBackend>`).
pub struct RedlockBackend {
    /// The nodes' handles, as given (for inspection).
    pub(super) clients: Vec<LockClient>,
    pub(super) nodes: Vec<RedisBackend>,
    /// Lease, wait budget, backoff and the engine's namespace: the first node's.
    pub(super) config: LockConfig,
    pub(super) node_timeout: Duration,
    /// Per node, whether its namespace differs from the engine's (so that it needs keys
    /// of its own); `None` when none does, and every node takes the engine's keys.
    own_keys: Option<Vec<bool>>,
    /// The last node that answered an acquisition: waiters listen to its releases.
    answered: AtomicUsize,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("nodes", &self.nodes.len())
            .field("node_timeout", &self.node_timeout)
            .finish_non_exhaustive()
    }
}

impl Backend for RedlockBackend {}

/// One node's copy of a grant.
pub(crate) struct Copy {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) value: Arc<str>,
}

/// A Redlock grant: the copy of each node that granted it, and until when each copy
/// is known to last (`None`: none, or lost).
pub(crate) struct Copies {
    pub(crate) nodes: Vec<Option<Copy>>,
    live: Mutex<Vec<Option<Instant>>>,
}

impl Copies {
    fn live(&self) -> MutexGuard<'_, Vec<Option<Instant>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Copies known to be held now.
    pub(crate) fn held(&self) -> usize {
        let now = Instant::now();
        self.live().iter().flatten().filter(|u| **u > now).count()
    }

    /// Until when a quorum of copies is known to last.
    fn quorum_until(&self, quorum: usize) -> Instant {
        let now = Instant::now();
        let left: Vec<Duration> = (self.live().iter().flatten())
            .map(|u| u.saturating_duration_since(now))
            .collect();
        // Each copy's time already has its drift allowance taken off.
        now + quorum::quorum_validity(left, quorum, Duration::ZERO)
    }

    /// Records node `i`'s answer about its copy.
    fn answered(&self, i: usize, answer: Option<Instant>) {
        if let Some(slot) = self.live().get_mut(i) {
            *slot = match (answer, *slot) {
                (Some(new), Some(old)) => Some(new.max(old)),
                (answer, _) => answer,
            };
        }
    }
}

impl RedlockBackend {
    pub(super) fn new(
        clients: Vec<LockClient>,
        config: LockConfig,
        node_timeout: Duration,
    ) -> Self {
        let own_keys: Vec<bool> = clients
            .iter()
            .map(|c| c.config().namespace != config.namespace)
            .collect();
        let own_keys = own_keys.contains(&true).then_some(own_keys);
        Self {
            nodes: clients.iter().map(|c| c.backend().clone()).collect(),
            own_keys,
            clients,
            config,
            node_timeout,
            answered: AtomicUsize::new(0),
        }
    }

    fn quorum(&self) -> usize {
        quorum::quorum(self.nodes.len())
    }

    /// The keys of the lock `name` (escaped) on node `i` (each node has its namespace).
    fn node_keys(&self, i: usize, name: &str) -> LockKeys {
        let namespace = &self.nodes[i].client().config().namespace;
        key::escaped_lock_keys(namespace, name)
    }

    /// Gives back every copy of `grant` at once; answers as soon as the release's
    /// verdict is certain, or after the node timeout, with the tally, the first
    /// failure, and the nodes that answered. What has not answered by then (or when this
    /// is dropped) goes on in the background: a release is never cut short.
    async fn give_back_copies(
        &self,
        grant: &Arc<Copies>,
    ) -> (ReleaseTally, Option<String>, Vec<usize>) {
        let timeout = self.node_timeout;
        let held = grant.nodes.iter().enumerate().filter(|(_, c)| c.is_some());
        // Each answer owns the grant (not a copy of its keys and value), so that it can
        // finish in the background.
        let mut answers = Stragglers(
            held.map(|(i, _)| {
                let (node, grant) = (self.nodes[i].clone(), grant.clone());
                let answer: GiveBack = Box::pin(async move {
                    let answer = match grant.nodes.get(i).and_then(Option::as_ref) {
                        Some(c) => node.give_back(&c.keys, &c.value).await,
                        None => Err(LockError::UnexpectedReply(format!(
                            "copy {i}: none to give back"
                        ))),
                    };
                    (i, answer)
                });
                answer
            })
            .collect(),
        );
        let count = answers.0.len();
        let mut tally = ReleaseTally::default();
        let mut cause = None;
        let mut answered = Vec::new();
        let nodes = self.nodes.len();
        // One timer for the whole release, however many answers it waits for.
        let time_up = tokio::time::sleep(timeout);
        tokio::pin!(time_up);
        while tally.verdict(nodes, count).is_none() {
            let next = tokio::select! {
                biased;
                next = answers.0.next() => next,
                () = &mut time_up => {
                    let late = answers.0.len();
                    tally.failed += late;
                    cause.get_or_insert_with(|| {
                        format!("{late} copies: no answer within {timeout:?}")
                    });
                    break;
                }
            };
            let Some((i, answer)) = next else {
                break;
            };
            match answer {
                Ok(h) => {
                    *match h {
                        Ok(()) => &mut tally.unlocked,
                        Err(Loss::TakenOver) => &mut tally.taken,
                        Err(Loss::Expired) => &mut tally.expired,
                    } += 1;
                    answered.push(i);
                }
                Err(e) => {
                    tally.failed += 1;
                    cause.get_or_insert_with(|| format!("copy {i}: {e}"));
                }
            }
        }
        (tally, cause, answered)
    }
}

/// One node's give-back in flight.
type GiveBack =
    std::pin::Pin<Box<dyn std::future::Future<Output = (usize, Result<Held, LockError>)> + Send>>;

/// The give-backs of a release still in flight: dropped, they finish in a task of
/// their own.
struct Stragglers(FuturesUnordered<GiveBack>);

impl Drop for Stragglers {
    fn drop(&mut self) {
        // Checked first: taking makes a new empty set, which allocates.
        if !self.0.is_empty() {
            let mut left = std::mem::take(&mut self.0);
            crate::client::cleanup::spawn_task(async move { while left.next().await.is_some() {} });
        }
    }
}

impl Seam for RedlockBackend {
    type Grant = Arc<Copies>;

    /// A node's copies of one group renew in one call to it: on a Cluster node, those
    /// of one hash slot (a lock's keys are on the slot of its name on every node).
    fn group(&self, key: &str) -> u16 {
        self.nodes.iter().map(|n| n.group(key)).max().unwrap_or(0)
    }

    fn kind(&self) -> StoreKind {
        StoreKind::Redlock
    }

    fn config(&self) -> &LockConfig {
        &self.config
    }

    const CAPABILITIES: Capabilities = Capabilities::RENEWED_LEASES.unordered();

    async fn take(
        &self,
        req: &Request,
        seq: u64,
        deadline: Instant,
    ) -> Result<Taken<Self::Grant>, LockError> {
        let started = Instant::now();
        let name = req.keys.name();
        // A node in the engine's namespace takes the engine's request as it is (its keys
        // are the node's); any other gets its own.
        let own: Vec<Option<Request>> = match &self.own_keys {
            Some(own) => (own.iter().enumerate())
                .map(|(i, own)| {
                    own.then(|| Request {
                        keys: Arc::new(self.node_keys(i, name)),
                        ..req.clone()
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        let request = |i: usize| own.get(i).and_then(Option::as_ref).unwrap_or(req);
        let timeout = self.node_timeout;
        // An answer that comes too late is dropped mid-request; the node's backend then
        // undoes the possible grant in the background.
        let answers = each_within(timeout, self.nodes.iter().enumerate(), |(i, node)| {
            node.take(request(i), seq, deadline)
        })
        .await;
        let elapsed = started.elapsed();
        let (mut granted, mut busy, mut retry_after, mut cause) = (0, 0, None, None);
        let mut first_answer = None;
        let mut copies: Vec<Option<(Copy, Option<FencingToken>)>> = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            let copy = match answer {
                Some(Ok(Taken::Granted { grant, token, .. })) => {
                    granted += 1;
                    first_answer.get_or_insert(i);
                    let keys = request(i).keys.clone();
                    Some((Copy { keys, value: grant }, token))
                }
                Some(Ok(Taken::Busy { retry_after: r, .. })) => {
                    busy += 1;
                    first_answer.get_or_insert(i);
                    retry_after = Some(retry_after.map_or(r, |a: Duration| a.min(r)));
                    None
                }
                Some(Err(e)) => {
                    cause.get_or_insert_with(|| format!("node {i}: {e}"));
                    None
                }
                None => {
                    cause.get_or_insert_with(|| format!("node {i}: no answer within {timeout:?}"));
                    None
                }
            };
            copies.push(copy);
        }
        if let Some(i) = first_answer {
            self.answered.store(i, Ordering::Relaxed);
        }
        let nodes = self.nodes.len();
        let lease = req.lease;
        let verdict = quorum::acquire_verdict(nodes, granted, busy, lease, elapsed);
        if let Acquired::Granted { .. } = verdict {
            let until = proven(started, lease);
            let token = copies
                .first()
                .and_then(|c| c.as_ref())
                .and_then(|(_, t)| *t);
            let live = copies.iter().map(|c| c.as_ref().map(|_| until)).collect();
            let nodes = copies
                .into_iter()
                .map(|c| c.map(|(copy, _)| copy))
                .collect();
            return Ok(Taken::Granted {
                grant: Arc::new(Copies {
                    nodes,
                    live: Mutex::new(live),
                }),
                token,
                valid: Validity::Until(until),
            });
        }
        // Every copy we got goes back before the next attempt, so that it cannot race
        // with these releases.
        if copies.iter().any(Option::is_some) {
            let got = Arc::new(Copies {
                nodes: copies
                    .into_iter()
                    .map(|c| c.map(|(copy, _)| copy))
                    .collect(),
                live: Mutex::new(Vec::new()),
            });
            self.give_back_copies(&got).await;
        }
        tracing::debug!(lock = %name, granted, needed = self.quorum(), busy, ?elapsed, "redlock attempt failed");
        let failure = match verdict {
            Acquired::TooLate => Some(LockError::ValidityExhausted {
                key: name.to_owned(),
                elapsed,
                lease,
            }),
            Acquired::NoQuorum | Acquired::Granted { .. } => Some(LockError::NoQuorum {
                key: name.to_owned(),
                op: "acquire",
                granted,
                needed: self.quorum(),
                nodes,
                cause,
            }),
            Acquired::Contended => None,
        };
        Ok(Taken::Busy {
            retry_after: retry_after.unwrap_or(Duration::MAX),
            failure,
        })
    }

    async fn give_back(&self, keys: &LockKeys, grant: &Self::Grant) -> Result<Held, LockError> {
        let count = grant.nodes.iter().flatten().count();
        let (tally, cause, answered) = self.give_back_copies(grant).await;
        for i in answered {
            grant.answered(i, None);
        }
        match tally.verdict(self.nodes.len(), count) {
            Some(ReleaseVerdict::Unlocked) => Ok(Ok(())),
            Some(ReleaseVerdict::NotOwner) => Ok(Err(Loss::TakenOver)),
            Some(ReleaseVerdict::Expired) => Ok(Err(Loss::Expired)),
            Some(ReleaseVerdict::NoQuorum) | None => Err(LockError::NoQuorum {
                key: keys.name().to_owned(),
                op: "release",
                granted: tally.unlocked,
                needed: self.quorum(),
                nodes: self.nodes.len(),
                cause,
            }),
        }
    }

    async fn extend(
        &self,
        keys: &LockKeys,
        grant: &Self::Grant,
        lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        let started = Instant::now();
        let timeout = self.node_timeout;
        let copies = grant
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)));
        let answers = each_within(timeout, copies, |(i, c)| async move {
            (i, self.nodes[i].extend(&c.keys, &c.value, lease).await)
        })
        .await;
        let (mut ok, mut cause) = (0, None);
        for answer in answers {
            match answer {
                Some((i, Ok(Ok(until)))) => {
                    ok += 1;
                    grant.answered(i, Some(until));
                }
                Some((i, Ok(Err(loss)))) => {
                    grant.answered(i, None);
                    cause.get_or_insert_with(|| loss.error(keys.name()).to_string());
                }
                Some((_, Err(e))) => {
                    cause.get_or_insert_with(|| e.to_string());
                }
                None => {
                    cause.get_or_insert_with(|| format!("no answer within {timeout:?}"));
                }
            }
        }
        if quorum::extended(self.nodes.len(), ok, lease, started.elapsed()) {
            return Ok(Ok(proven(started, lease)));
        }
        Err(LockError::NoQuorum {
            key: keys.name().to_owned(),
            op: "extend",
            granted: ok,
            needed: self.quorum(),
            nodes: self.nodes.len(),
            cause,
        })
    }

    async fn renew(
        &self,
        grants: &[(&LockKeys, &Self::Grant)],
        lease: Duration,
        within: Duration,
    ) -> Result<Vec<Renewed>, LockError> {
        let sent = Instant::now();
        // A node that does not answer (paused) holds the others' answers up at most the
        // node timeout, so they still count before the copies run out.
        let within = within.min(self.node_timeout);
        // One renewal call per node over that node's copies.
        let per_node = self.nodes.iter().enumerate().map(|(i, node)| async move {
            let mine: Vec<(usize, &Copy)> = grants
                .iter()
                .enumerate()
                .filter_map(|(g, (_, copies))| copies.nodes[i].as_ref().map(|c| (g, c)))
                .collect();
            if mine.is_empty() {
                return (i, Vec::new());
            }
            let calls: Vec<(&LockKeys, &Arc<str>)> =
                mine.iter().map(|(_, c)| (&*c.keys, &c.value)).collect();
            let answers = node.renew(&calls, lease, within).await;
            let indices = mine.into_iter().map(|(g, _)| g);
            (
                i,
                match answers {
                    // An entry's error, like a failed call, is no answer from this node.
                    Ok(answers) => indices.zip(answers.into_iter().map(Result::ok)).collect(),
                    Err(_) => indices.map(|g| (g, None)).collect(),
                },
            )
        });
        let answers = futures_util::future::join_all(per_node).await;
        let n = self.nodes.len();
        let q = self.quorum();
        let mut ok = vec![0usize; grants.len()];
        let mut lost: Vec<(usize, bool)> = vec![(0, false); grants.len()];
        for (i, node_answers) in answers {
            for (g, answer) in node_answers {
                let copies = grants[g].1;
                match answer {
                    Some(Ok(until)) => {
                        ok[g] += 1;
                        copies.answered(i, Some(until));
                    }
                    Some(Err(loss)) => {
                        lost[g].0 += 1;
                        lost[g].1 |= loss == Loss::TakenOver;
                        copies.answered(i, None);
                    }
                    // No answer: the copy stands as it was.
                    None => {}
                }
            }
        }
        let missing = |g: usize| grants[g].1.nodes.iter().filter(|c| c.is_none()).count();
        Ok((0..grants.len())
            .map(|g| {
                Ok(if ok[g] >= q && sent.elapsed() + drift(lease) < lease {
                    Ok(proven(sent, lease))
                } else if lost[g].0 + missing(g) > n - q {
                    Err(if lost[g].1 {
                        Loss::TakenOver
                    } else {
                        Loss::Expired
                    })
                } else {
                    // Not renewed, not lost: what a quorum of copies is known to last.
                    Ok(grants[g].1.quorum_until(q))
                })
            })
            .collect())
    }

    async fn fence(
        &self,
        keys: &LockKeys,
        grant: &Self::Grant,
        seq: u64,
    ) -> Result<Held<FencingToken>, LockError> {
        // The designated node's counter: the first node.
        let Some(c) = grant.nodes.first().and_then(Option::as_ref) else {
            return Err(LockError::NoFencingToken {
                key: keys.name().to_owned(),
                reason: "the first node, whose counter gives a Redlock's tokens, did not grant it",
            });
        };
        match self.nodes[0].fence(&c.keys, &c.value, seq).await? {
            Ok(token) => Ok(Ok(token)),
            // One copy gone is not the lock lost (that takes more than N - quorum), but
            // that node's counter no longer orders this grant.
            Err(_) => Err(LockError::NoFencingToken {
                key: keys.name().to_owned(),
                reason: "the first node, whose counter gives a Redlock's tokens, no longer \
                         holds its copy of the grant",
            }),
        }
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, channel: &'a str) -> Option<Listen<'a>> {
        let i = self.answered.load(Ordering::Relaxed);
        let node = self.nodes.get(i)?;
        Some(Listen::Hub(node.client().hub(), channel))
    }

    fn channel(&self, req: &Request) -> String {
        let i = self
            .answered
            .load(Ordering::Relaxed)
            .min(self.nodes.len() - 1);
        self.node_keys(i, req.keys.name()).channel()
    }
}
