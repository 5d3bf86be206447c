//! `LockGuard`: proof of holding a lock, with release, extend and the lost signal.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::client::{LockClient, Request};
use crate::config::check_lease;
use crate::held::{Held, ReleasePlan};
use crate::scripts::RENEW;
use crate::{FencingToken, LockError};

/// What a successful [`LockGuard::release`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The lock is free: deleted in Redis, and waiters were told.
    Unlocked,
    /// This was a re-entered hold; the owner still holds the lock `holds_left` times.
    StillHeld {
        /// Holds of the same owner that remain.
        holds_left: u32,
    },
}

/// A held lock.
///
/// Behavior:
/// - [`release`](Self::release) says what happened: [`Released::Unlocked`],
///   [`Released::StillHeld`] (re-entered), or the errors [`LockError::Expired`] and
///   [`LockError::NotOwner`] when the lease ran out before.
/// - Dropped without `release` (early return, `?`, panic, a cancelled future), it stops
///   its renewal at once and releases in the background on the runtime it was acquired
///   on. Dropping never blocks.
/// - When the lock is lost (renewal refused or failed until the lease ran out, or a
///   fixed lease passed), [`is_held`](Self::is_held) turns false and
///   [`lost`](Self::lost) resolves, so the critical section can stop.
/// - [`fencing_token`](Self::fencing_token) grows with every fresh grant of this lock;
///   hand it to the resource you write so it can refuse stale holders
///   ([`LockClient::fenced_write`]).
#[must_use = "dropping a LockGuard releases the lock at once"]
pub struct LockGuard {
    client: LockClient,
    held: Arc<Held>,
    token: FencingToken,
    lost: watch::Receiver<bool>,
    runtime: Handle,
    done: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.held.keys.name)
            .field("token", &self.token)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(
        client: LockClient,
        held: Arc<Held>,
        token: FencingToken,
        runtime: Handle,
    ) -> Self {
        let lost = held.lost_tx.subscribe();
        Self {
            client,
            held,
            token,
            lost,
            runtime,
            done: false,
        }
    }

    /// The lock's name as stored (parts escaped and joined).
    pub fn name(&self) -> &str {
        &self.held.keys.name
    }

    /// The fencing token of this grant (shared by re-entered holds).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The owner id this guard holds the lock as (client id and scope).
    pub fn owner(&self) -> &str {
        &self.held.owner
    }

    /// True while the lease is known to be in force and the lock was not reported lost.
    pub fn is_held(&self) -> bool {
        !*self.lost.borrow() && Instant::now() < self.held.state().valid_until
    }

    /// How long the lease is known to last from now (zero once lost).
    pub fn valid_for(&self) -> Duration {
        if *self.lost.borrow() {
            return Duration::ZERO;
        }
        self.held
            .state()
            .valid_until
            .saturating_duration_since(Instant::now())
    }

    /// Resolves when the lock is lost. Never resolves while the lock is held, so race it
    /// against the critical section:
    ///
    /// ```no_run
    /// # async fn demo(guard: lock_core::LockGuard) {
    /// # async fn work() {}
    /// tokio::select! {
    ///     _ = guard.lost() => { /* stop: someone else may hold the lock now */ }
    ///     _ = work() => {}
    /// }
    /// # }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.lost.clone();
        async move {
            // The sender lives as long as any guard: an error cannot happen while we wait.
            let _ = rx.wait_for(|lost| *lost).await;
        }
    }

    /// Gives back this hold.
    pub async fn release(mut self) -> Result<Released, LockError> {
        self.done = true;
        let plan = self.client.inner.registry.release(&self.held);
        release_remote(&self.client, &self.held, plan).await
    }

    /// Lets the lock run out on its own: stops renewing it and never releases it, so it
    /// stays taken until its lease passes (an anti-resubmit window; the
    /// `release = "on_expiry"` mode of `#[cache_lock]`). With the watchdog lease that is
    /// up to [`LockConfig::watchdog_lease`](crate::LockConfig::watchdog_lease) from the
    /// last renewal.
    pub fn hold_until_expiry(mut self) {
        self.done = true;
        // Local bookkeeping only: no release is sent.
        let _ = self.client.inner.registry.release(&self.held);
    }

    /// Sets the lease to `lease` from now. Fails with [`LockError::Expired`] or
    /// [`LockError::NotOwner`] (and fires [`lost`](Self::lost)) if the lock is gone.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        check_lease("lease", lease)?;
        if self.held.is_lost() {
            return Err(LockError::Expired {
                key: self.held.keys.name.clone(),
            });
        }
        let start = Instant::now();
        let mut inv = RENEW.prepare_invoke();
        inv.key(&self.held.keys.hash)
            .arg(&self.held.owner)
            .arg(lease.as_millis() as u64);
        let reply: Vec<i64> = self.client.inner.conn.invoke("extend", &inv).await?;
        match reply[..] {
            [1] => {
                let mut st = self.held.state();
                st.lease = lease;
                st.valid_until = start + lease;
                let due = st.valid_until;
                drop(st);
                self.client.inner.watchdog.schedule(&self.client.inner, due);
                Ok(())
            }
            [0] => Err(lose(&self.client, &self.held, false)),
            [-1] => Err(lose(&self.client, &self.held, true)),
            _ => Err(LockError::UnexpectedReply(format!(
                "renew.lua returned {reply:?}"
            ))),
        }
    }

    /// Takes the same lock again as the same owner (a re-entered hold; no waiting).
    pub async fn reenter(&self) -> Result<LockGuard, LockError> {
        let request = {
            let st = self.held.state();
            Request {
                keys: self.held.keys.clone(),
                owner: self.held.owner.clone(),
                lease: st.lease,
                watchdog: st.watchdog,
                max_hold: None,
            }
        };
        self.client.acquire_request(&request, Duration::ZERO).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Local bookkeeping now (renewal stops at once); the Redis call in the background.
        let plan = self.client.inner.registry.release(&self.held);
        let client = self.client.clone();
        let held = self.held.clone();
        self.runtime.spawn(async move {
            match release_remote(&client, &held, plan).await {
                Ok(outcome) => tracing::debug!(lock = %held.keys.name, ?outcome, "dropped guard released"),
                Err(e) => tracing::warn!(lock = %held.keys.name, error = %e, "dropped guard could not release"),
            }
        });
    }
}

async fn release_remote(
    client: &LockClient,
    held: &Arc<Held>,
    plan: ReleasePlan,
) -> Result<Released, LockError> {
    let mode = match plan {
        ReleasePlan::One => "0",
        ReleasePlan::All => "1",
        ReleasePlan::Peek => "peek",
    };
    let r = client.release_call(held, mode).await?;
    let key = || held.keys.name.clone();
    match (plan, r) {
        (ReleasePlan::Peek, -2) => Err(LockError::NotOwner { key: key() }),
        (ReleasePlan::Peek, _) => Err(LockError::Expired { key: key() }),
        (_, 0) => {
            if plan == ReleasePlan::One {
                // Redis had fewer holds than our guards: the others' lock is gone too.
                lose(client, held, false);
            }
            client.inner.hub.notify_local(&held.keys.channel);
            tracing::debug!(lock = %held.keys.name, "lock released");
            Ok(Released::Unlocked)
        }
        (_, n) if n > 0 => Ok(Released::StillHeld {
            holds_left: u32::try_from(n).unwrap_or(u32::MAX),
        }),
        (_, -1) => Err(lose(client, held, false)),
        (_, -2) => Err(lose(client, held, true)),
        _ => Err(LockError::UnexpectedReply(format!(
            "release.lua returned {r}"
        ))),
    }
}

/// Marks `held` lost and returns the matching error.
fn lose(client: &LockClient, held: &Arc<Held>, taken: bool) -> LockError {
    client.inner.registry.detach(held);
    if held.mark_lost() {
        tracing::warn!(lock = %held.keys.name, taken_over = taken, "lock lost");
    }
    let key = held.keys.name.clone();
    if taken {
        LockError::NotOwner { key }
    } else {
        LockError::Expired { key }
    }
}
