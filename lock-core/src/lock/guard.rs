//! `LockGuard`: proof of holding a lock, with release, extend and the lost signal.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::Request;
use super::core::Core;
use super::registry::{Grant, Plan};
use super::seam::Backend;
use crate::backends::RedisBackend;
use crate::client::config::check_lease;
use crate::error::LockError;
use crate::metrics::ReleaseOutcome;
use crate::owner::FencingToken;
use crate::owner::LockScope;

/// What a successful [`LockGuard::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The lock is free: given back to the store, and waiters were told.
    Unlocked,
    /// This was a re-entered hold; the owner still holds the lock `holds_left` times
    /// (counted by this client: nothing was sent to the store).
    StillHeld {
        /// Holds of the same owner that remain.
        holds_left: u32,
    },
}

/// A held lock, on any store: `LockGuard` (on Redis, from a
/// [`LockClient`](crate::LockClient)) or `LockGuard<B>` for the store `B`
/// ([`MemoryGuard`](crate::MemoryGuard) for [`MemoryLocks`](crate::MemoryLocks)).
///
/// Behavior:
/// - [`release`](Self::release) says what happened: [`Released::Unlocked`],
///   [`Released::StillHeld`] (re-entered), or the errors [`LockError::Expired`] and
///   [`LockError::NotOwner`] when the lease ran out before.
/// - Dropped without `release` (early return, `?`, panic, a cancelled future), it stops
///   its renewal at once and releases in the background (on the dropping task's runtime,
///   or the process's background runtime when there is none). Dropping never blocks.
/// - When the lock is lost (renewal refused or failed until the lease ran out, or a
///   fixed lease passed), [`is_held`](Self::is_held) turns false and
///   [`lost`](Self::lost) resolves, so the critical section can stop.
/// - [`fence`](Self::fence) gives this grant's fencing token (taken on first use, one
///   round trip, or with the grant when acquired with
///   [`LockOptions::fenced`](crate::LockOptions::fenced)); tokens grow with every grant
///   of this lock. Hand it to the resource you write so it can refuse stale holders
///   ([`LockClient::fenced_write`](crate::LockClient::fenced_write)).
#[must_use = "dropping a LockGuard releases the lock at once"]
pub struct LockGuard<B: Backend = RedisBackend> {
    core: Arc<Core<B>>,
    pub(super) grant: Arc<Grant<B>>,
    /// This hold asked for the watchdog lease.
    watched: bool,
    done: bool,
}

impl<B: Backend> std::fmt::Debug for LockGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.grant.keys.name())
            .field("token", &self.grant.token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> LockGuard<B> {
    pub(crate) fn new(core: Arc<Core<B>>, grant: Arc<Grant<B>>, watched: bool) -> Self {
        Self {
            core,
            grant,
            watched,
            done: false,
        }
    }

    /// The store's record of this grant.
    pub(crate) fn record(&self) -> &B::Grant {
        &self.grant.record
    }

    /// The lock's name as stored (parts escaped and joined).
    pub fn name(&self) -> &str {
        self.grant.keys.name()
    }

    /// The keys of this lock (its name and stored key; on Redis also its fence key and
    /// channel), for inspection and tooling.
    pub fn keys(&self) -> &crate::LockKeys {
        &self.grant.keys
    }

    /// The fencing token of this grant, if it was taken already (with a
    /// [`fenced`](crate::LockOptions::fenced) acquisition, or by [`fence`](Self::fence));
    /// shared by re-entered holds.
    pub fn fencing_token(&self) -> Option<FencingToken> {
        self.grant.token.get().copied()
    }

    /// The fencing token of this grant: the one taken already, or one taken now (one
    /// script call that checks the grant still holds the lock, so the token is larger
    /// than every earlier holder's and smaller than every later one's). Fails with
    /// [`LockError::Expired`] / [`LockError::NotOwner`] if the grant was lost.
    ///
    /// ```no_run
    /// # async fn demo(client: lock_core::LockClient) -> Result<(), lock_core::LockError> {
    /// let guard = client.lock(("stock", 7_u64)).await?;
    /// let token = guard.fence().await?;
    /// client.fenced_write("stock:7", token, 99).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn fence(&self) -> Result<FencingToken, LockError> {
        // The token taken already answers only while the lease is known to hold; past
        // it, the store is asked (and says whether the grant was lost).
        match self.fencing_token() {
            Some(token) if self.is_held() => Ok(token),
            _ => self.core.fence(&self.grant).await,
        }
    }

    /// True while the lease is known to be in force and the lock was not reported lost.
    pub fn is_held(&self) -> bool {
        !self.valid_for().is_zero()
    }

    /// How long the lease is known to last from now (zero once lost): on Redis the
    /// lease less the time its request took and a drift allowance of 1% + 2 ms, as
    /// confirmed by the last grant, renewal or extension; on a store that keeps a
    /// grant while it is held, the watchdog lease.
    pub fn valid_for(&self) -> Duration {
        self.core.valid_for(&self.grant)
    }

    /// Resolves when the lock is lost: a renewal or release found another grant or
    /// none, or the lease the client can prove ran out (by its own clock, whatever a
    /// renewal call is doing). Never resolves while the lock is held, nor once it was
    /// given up (released, or left to expire) without a loss, so race it against the
    /// critical section and drop it with the guard:
    ///
    /// ```no_run
    /// # async fn demo(guard: lock_core::LockGuard) {
    /// # async fn work() {}
    /// tokio::select! {
    ///     biased; // the loss first, should both be ready after a pause
    ///     _ = guard.lost() => { /* stop: someone else may hold the lock now */ }
    ///     _ = work() => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let grant = self.grant.clone();
        async move {
            // Also on this task's own clock: the lease's end is the loss, whenever the
            // watchdog (on its own runtime, or none for some stores) gets to it.
            loop {
                // Armed before the state is read, so a loss in between is not missed.
                let lost = grant.lost_wake.notified();
                tokio::pin!(lost);
                lost.as_mut().enable();
                let (gone, until, clocked) = {
                    let st = grant.state();
                    // Given up (released, or left to expire): no lease of its own to
                    // run out, though a release that finds it lost still wakes this.
                    (st.lost.is_some(), st.valid_until, !st.kept && !st.ended)
                };
                if gone || (clocked && Instant::now() >= until) {
                    return;
                }
                if !clocked {
                    lost.await;
                } else {
                    tokio::select! {
                        () = lost => {}
                        () = tokio::time::sleep_until(until) => {}
                    }
                }
            }
        }
    }

    /// Gives back this hold. The last hold of the grant gives it back to the store (only
    /// this grant: on Redis a compare-and-delete of its value); other holds are counted
    /// locally. Cancelled while the call is in flight, it finishes in the background.
    ///
    /// A call that Redis does not answer (unreachable, the connection dropped, timed
    /// out; too few Redlock nodes) returns that error, and the release is sent again in
    /// the background as a dropped guard's is: the lock is freed as soon as a try gets
    /// through, else by its lease.
    pub async fn release(mut self) -> Result<Released, LockError> {
        self.done = true;
        match self.core.release_hold(&self.grant, self.watched, true) {
            Plan::StillHeld(holds_left) => {
                self.released_locally(Ok(Released::StillHeld { holds_left }))
            }
            Plan::Lost(loss) => self.released_locally(Err(loss.error(self.grant.keys.name()))),
            Plan::Last => self.core.release_last(&self.grant, None, false).await,
            Plan::LastLost(loss) => self.core.release_last(&self.grant, Some(loss), false).await,
        }
    }

    /// A hold given back without a store call (others remain): counted, and returned.
    fn released_locally(&self, result: Result<Released, LockError>) -> Result<Released, LockError> {
        let kind = self.core.backend.kind();
        self.grant.count_release(kind, &result);
        result
    }

    /// Lets the lock run out on its own: stops renewing it and never releases it, so it
    /// stays taken until its lease passes (an anti-resubmit window; the
    /// `release = "on_expiry"` mode of `#[cache_lock]`). With the watchdog lease that is
    /// up to [`LockConfig::watchdog_lease`](crate::LockConfig::watchdog_lease) from the
    /// last renewal.
    pub fn hold_until_expiry(mut self) {
        self.done = true;
        // Local bookkeeping only: no release is sent.
        if let Plan::Last | Plan::LastLost(_) =
            self.core.release_hold(&self.grant, self.watched, false)
        {
            self.core.let_expire(&self.grant);
        }
    }

    /// Lengthens the lease to `lease` from now; never shortens it (a renewal and an
    /// extension may cross on the way, and every hold counts on the longest it was
    /// told), so to end a lock early, release it. Fails with
    /// [`LockError::Expired`] or [`LockError::NotOwner`] (and fires
    /// [`lost`](Self::lost)) if the lock is gone.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        check_lease("lease", lease)?;
        self.core.extend_grant(&self.grant, lease).await
    }

    /// Takes the same lock again as the same owner (a re-entered hold; no waiting, no
    /// round trip unless the lease must grow). Fails with the loss if the lock was lost.
    pub async fn reenter(&self) -> Result<LockGuard<B>, LockError> {
        if let Some(loss) = self.grant.state().lost {
            return Err(loss.error(self.grant.keys.name()));
        }
        let lease = self.core.valid_for(&self.grant);
        if lease.is_zero() {
            // Ran out unnoticed: a fresh grant would not be this one.
            return Err(crate::lock::registry::Loss::Expired.error(self.grant.keys.name()));
        }
        let request = Request {
            keys: self.grant.keys.clone(),
            scope: LockScope::from_id(self.grant.scope),
            lease: lease.max(crate::client::config::MIN_LEASE),
            watchdog: self.watched,
            max_hold: None,
            fenced: false,
            fair: false,
            value: None,
            primitive: self.grant.primitive,
        };
        self.core.acquire(&request, Duration::ZERO).await
    }
}

impl LockGuard<RedisBackend> {
    /// The owner id this guard holds the lock as (client id and scope).
    pub fn owner(&self) -> &str {
        crate::backends::redis::owner_of(&self.grant.record)
    }

    /// The value this grant wrote to the lock key in Redis (unique per grant; shared
    /// by re-entered holds). For inspection and tooling.
    pub fn grant_value(&self) -> &str {
        &self.grant.record
    }
}

impl<B: Backend> Drop for LockGuard<B> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Local bookkeeping now (renewal stops at once); the Redis call in the background.
        match self.core.release_hold(&self.grant, self.watched, true) {
            Plan::StillHeld(holds_left) => {
                let _ = self.released_locally(Ok(Released::StillHeld { holds_left }));
            }
            Plan::Lost(loss) => {
                let _ = self.released_locally(Err(loss.error(self.grant.keys.name())));
            }
            Plan::Last => self.core.release_in_background(&self.grant, None),
            Plan::LastLost(loss) => self.core.release_in_background(&self.grant, Some(loss)),
        }
    }
}

/// The metrics label of a release that returned `result`.
pub(crate) fn release_outcome(result: &Result<Released, LockError>) -> ReleaseOutcome {
    match result {
        Ok(Released::StillHeld { .. }) => ReleaseOutcome::StillHeld,
        Ok(_) => ReleaseOutcome::Unlocked,
        Err(LockError::Expired { .. }) => ReleaseOutcome::Expired,
        Err(LockError::NotOwner { .. }) => ReleaseOutcome::NotOwner,
        Err(_) => ReleaseOutcome::Error,
    }
}
