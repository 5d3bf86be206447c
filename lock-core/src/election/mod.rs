//! Leader election on any store: [`Election`].
//!
//! Campaigning is waiting for one lock, leading is holding it, the term is the grant's
//! fencing token and resigning is the release. Everything the lock promises carries
//! over, on every store, with nothing of its own to get wrong: at most one leader has
//! validity left at any instant (the lock's guard), a leader learns of its loss by
//! `lost()` (the lock's loss signal), and every new leader's term is larger (the
//! store's fencing tokens only grow). A leader that is paused, cut off or whose store
//! restarts is no longer leading once its lease could have run out, whatever it did
//! not hear.
//!
//! An `Election` is one candidate: it campaigns in a [`LockScope`] of its own, so two
//! candidates on one client exclude each other like two processes.

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use crate::client::config::{Backoff, Lease};
use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::lock::{LockOptions, Released};
use crate::metrics::Primitive;
use crate::owner::{FencingToken, LockScope};
use crate::traits::{DistributedLock, HeldLock};

/// How long [`Election::run`] waits in one campaign before it asks again (a release
/// wakes it at once: this only bounds one call).
const CAMPAIGN_WAIT: Duration = Duration::from_secs(30);
/// The pauses of [`Election::run`] after campaigns failed for the store.
const RETRY: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// One candidate for leadership of `name` on the lock store `locks` (any
/// [`DistributedLock`]: a [`LockClient`](crate::LockClient), a `Redlock`, a store of
/// [`Locks`](crate::Locks), an [`AnyLocks`](crate::AnyLocks)).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use std::ops::ControlFlow;
/// use lock_core::{Election, LockClient};
///
/// let client = LockClient::open("redis://127.0.0.1/").await?;
/// let election = Election::new(client, "billing-scheduler");
/// // Leads whenever it can: the closure runs while this process leads, is dropped
/// // the moment the leadership is lost, and the candidate campaigns again.
/// election
///     .run(|term| async move {
///         // ... the leader's work, its writes fenced with `term` ...
///         # let _ = term;
///         ControlFlow::Break(()) // resign and stop campaigning
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Election<L, N> {
    locks: L,
    name: N,
    scope: LockScope,
    rejoin: bool,
    value: Option<Vec<u8>>,
}

impl<L, N> Election<L, N>
where
    L: DistributedLock,
    N: LockName + Clone + Send + Sync,
{
    /// A candidate for `name` on `locks`, in a scope of its own.
    pub fn new(locks: L, name: N) -> Self {
        Self {
            locks,
            name,
            scope: LockScope::new(),
            rejoin: true,
            value: None,
        }
    }

    /// Whether [`run`](Self::run) campaigns again after its leadership was lost
    /// (default `true`); `false` makes it return [`LockError::Expired`] instead.
    pub fn rejoin_after_loss(mut self, rejoin: bool) -> Self {
        self.rejoin = rejoin;
        self
    }

    /// What this candidate keeps beside its campaign for others to read (its address,
    /// say), as Go's `Election.Campaign(ctx, value)` does: see
    /// [`LockOptions::value`]. Only stores that keep a value take it (etcd, where
    /// `EtcdLocks::holder` reads the leader's and `EtcdLocks::proclaim` replaces it);
    /// elsewhere a campaign answers [`LockError::Unsupported`].
    pub fn value(mut self, value: impl Into<Vec<u8>>) -> Self {
        self.value = Some(value.into());
        self
    }

    /// The store it campaigns on.
    pub fn locks(&self) -> &L {
        &self.locks
    }

    /// The election's name.
    pub fn name(&self) -> &N {
        &self.name
    }

    /// Campaigns once: resolves when this candidate leads, or with
    /// [`LockError::Timeout`] after `wait` (zero: only if nobody leads now, else
    /// [`LockError::Busy`]). Campaigning again while leading answers the same term.
    ///
    /// A grant without a fencing token is not a leadership: it is given back and the
    /// campaign answers [`LockError::NoFencingToken`]. Only a `Redlock` does that, when
    /// its first node (where its tokens come from) missed the grant; with that node
    /// down, a Redlock elects nobody.
    pub async fn campaign(&self, wait: Duration) -> Result<Leadership<L::Guard>, LockError> {
        // Held for as long as this candidate leads, whatever lease the client gives
        // its locks (a client-wide max-hold still caps a term).
        let mut options = LockOptions::new()
            .scope(&self.scope)
            .wait(wait)
            .lease(Lease::Watchdog)
            .fenced();
        options.primitive = Some(Primitive::Election);
        if let Some(value) = &self.value {
            options = options.value(value.clone());
        }
        let guard = self.locks.acquire(self.name.clone(), options).await?;
        match guard.fence().await? {
            Some(term) => Ok(Leadership { guard, term }),
            None => {
                let key = guard.name().to_owned();
                // A leader without a term could not fence its writes: do not lead.
                let _ = guard.release().await;
                Err(LockError::NoFencingToken {
                    key,
                    reason: "the store issued no fencing token to serve as the term",
                })
            }
        }
    }

    /// Leads whenever it can: campaigns, runs `lead(term)` while leading, and
    /// campaigns again; until `lead` answers [`ControlFlow::Break`] (then it resigns
    /// and returns) or an error that waiting does not cure (a bad name, a
    /// misconfiguration; a grant without a term, as on a `Redlock` whose first node
    /// missed it, is campaigned for again). `lead` answering [`ControlFlow::Continue`] resigns the term
    /// and campaigns again (others get their turn on a fair store).
    ///
    /// When the leadership is lost, `lead`'s future is dropped at once (its work must
    /// stop at an await) and, unless [`rejoin_after_loss(false)`](Self::rejoin_after_loss),
    /// the candidate campaigns again. A store that cannot be reached is asked again
    /// after a jittered pause ([`Backoff`]) that grows from 100 ms up to 5 s.
    pub async fn run<F, Fut>(&self, mut lead: F) -> Result<(), LockError>
    where
        F: FnMut(FencingToken) -> Fut,
        Fut: Future<Output = ControlFlow<()>>,
    {
        let mut failed = 0;
        loop {
            let leadership = match self.campaign(CAMPAIGN_WAIT).await {
                Ok(l) => l,
                Err(e) => match after_campaign(&e) {
                    AfterCampaign::Again => continue,
                    AfterCampaign::Pause => {
                        let pause = RETRY.delay(failed);
                        failed += 1;
                        tracing::warn!(error = %e, "campaign failed; trying again in {pause:?}");
                        tokio::time::sleep(pause).await;
                        continue;
                    }
                    AfterCampaign::Stop => return Err(e),
                },
            };
            failed = 0;
            let lost = leadership.lost();
            // The loss first: after a pause past the lease both are ready, and the work
            // must not take another step.
            let flow = tokio::select! {
                biased;
                () = lost => None,
                flow = lead(leadership.term()) => Some(flow),
            };
            match flow {
                Some(ControlFlow::Break(())) => {
                    return match leadership.resign().await {
                        Err(e) if !e.is_lost() => Err(e),
                        _ => Ok(()),
                    };
                }
                Some(ControlFlow::Continue(())) => {
                    if let Err(e) = leadership.resign().await {
                        tracing::debug!(error = %e, "resigning a term failed");
                    }
                }
                None => {
                    let key = leadership.guard.name().to_owned();
                    tracing::warn!(election = %key, term = leadership.term.get(), "leadership lost");
                    drop(leadership);
                    if !self.rejoin {
                        return Err(LockError::Expired { key });
                    }
                }
            }
        }
    }
}

/// This candidate leads: the election's lock is held, its fencing token the term.
/// Dropped, it resigns in the background.
#[derive(Debug)]
pub struct Leadership<G> {
    guard: G,
    term: FencingToken,
}

impl<G: HeldLock> Leadership<G> {
    /// The term: this leadership's fencing token, larger than every earlier leader's.
    /// Fence the leader's writes with it.
    pub fn term(&self) -> FencingToken {
        self.term
    }

    /// True while this candidate is known to lead (the lock is held, validity left).
    pub fn is_leading(&self) -> bool {
        self.guard.is_held()
    }

    /// How long this candidate is known to lead from now (zero once lost).
    pub fn valid_for(&self) -> Duration {
        self.guard.valid_for()
    }

    /// Resolves when the leadership is lost; never while it is held.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// The lock held, for the store's own fenced writes (such as
    /// `EtcdLocks::write_fenced`).
    pub fn guard(&self) -> &G {
        &self.guard
    }

    /// Steps down: the next candidate may lead.
    pub async fn resign(self) -> Result<Released, LockError> {
        self.guard.release().await
    }
}

/// What [`Election::run`] does after a campaign that failed with a given error.
#[derive(Debug, PartialEq, Eq)]
enum AfterCampaign {
    /// Campaign again at once: the campaign's own wait was the pause.
    Again,
    /// Campaign again after a growing pause: the store did not answer, or answered
    /// without a term.
    Pause,
    /// Return the error: waiting does not cure it.
    Stop,
}

fn after_campaign(e: &LockError) -> AfterCampaign {
    match e {
        LockError::Busy { .. } | LockError::Timeout { .. } => AfterCampaign::Again,
        // Granted, then lost before its term was read (a pause past the lease): this
        // candidate never led, so it campaigns again.
        e if e.is_lost() => AfterCampaign::Again,
        // A store that did not answer in time (or too few Redlock nodes) is a store
        // that cannot be reached now.
        e if e.is_unavailable() || matches!(e, LockError::NoFencingToken { .. }) => {
            AfterCampaign::Pause
        }
        _ => AfterCampaign::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_campaigns_own_wait_is_followed_by_another_at_once() {
        let key = || "k".to_owned();
        let waited = LockError::Timeout {
            key: key(),
            waited: Duration::from_secs(30),
        };
        assert_eq!(after_campaign(&waited), AfterCampaign::Again);
        let busy = LockError::Busy {
            key: key(),
            retry_after: Duration::from_millis(5),
        };
        assert_eq!(after_campaign(&busy), AfterCampaign::Again);
        // The store not answering in time is paused for, as any unreachable store.
        let silent = LockError::RedisTimeout {
            op: "acquire",
            after: Duration::from_millis(50),
        };
        assert_eq!(after_campaign(&silent), AfterCampaign::Pause);
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(LockError::Redis(io.clone()).is_timeout());
        assert_eq!(after_campaign(&LockError::Redis(io)), AfterCampaign::Pause);
        let no_term = LockError::NoFencingToken {
            key: key(),
            reason: "none",
        };
        assert_eq!(after_campaign(&no_term), AfterCampaign::Pause);
        for lost in [
            LockError::Expired { key: key() },
            LockError::NotOwner { key: key() },
        ] {
            assert_eq!(after_campaign(&lost), AfterCampaign::Again, "{lost}");
        }
        let bad = LockError::InvalidKey("empty".into());
        assert_eq!(after_campaign(&bad), AfterCampaign::Stop);
    }
}
