//! `Core`: what a client and its guards share (the backend, the registry, the
//! watchdog), and the engine's side of a release, a fence and an extension.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::registry::{Grant, Loss, Plan, Registry};
use super::seam::{Held, Seam, give_back_patiently};
use super::watchdog::Watchdog;
use crate::client::cleanup;
use crate::client::config::LockConfig;
use crate::error::LockError;
use crate::lock::Released;
use crate::owner::FencingToken;

pub(crate) struct Core<B: Seam> {
    pub(crate) backend: Arc<B>,
    pub(crate) registry: Arc<Registry<B>>,
    pub(crate) watchdog: Watchdog<B>,
    grants: AtomicU64,
}

impl<B: Seam> Core<B> {
    pub(crate) fn new(backend: B) -> Self {
        let registry = Arc::new(Registry::new(backend.kind()));
        let backend = Arc::new(backend);
        Self {
            watchdog: Watchdog::new(backend.clone(), registry.clone()),
            backend,
            registry,
            grants: AtomicU64::new(1),
        }
    }

    pub(crate) fn config(&self) -> &LockConfig {
        self.backend.config()
    }

    /// A number for a new grant, unique in this client (the watchdog's queue key, and
    /// part of the grant's record on stores that need one).
    pub(crate) fn next_seq(&self) -> u64 {
        self.grants.fetch_add(1, Ordering::Relaxed)
    }

    /// Puts `grant` under the watchdog, where the store needs one and the grant is
    /// renewed. A grant left to its fixed lease needs no entry there: its end is read
    /// off the clock by whoever asks (`valid_for`, `lost()`, and the registry, which
    /// takes an overdue grant as lost on the scope's next acquisition or release).
    pub(crate) fn schedule(&self, grant: &Arc<Grant<B>>) {
        let renewed = || {
            let st = grant.state();
            !st.kept && st.next_renewal.is_some()
        };
        if B::CAPABILITIES.renews && renewed() {
            self.watchdog.schedule(grant);
        }
    }

    /// Forwards the loss the store reports for `grant` (a task that ends with
    /// the grant, holding it only weakly).
    pub(crate) fn watch_store_loss(&self, grant: &Arc<Grant<B>>) {
        let Some(reported) = self.backend.store_loss(&grant.record) else {
            return;
        };
        let (registry, weak) = (self.registry.clone(), Arc::downgrade(grant));
        // As long as the grant is held, which may be longer than its runtime lives.
        cleanup::spawn_lasting(async move {
            if let Some(loss) = reported.await
                && let Some(grant) = weak.upgrade()
            {
                registry.lose(&grant, loss);
            }
        });
    }

    /// How long `grant` is known to last from now (zero once lost).
    pub(crate) fn valid_for(&self, grant: &Grant<B>) -> Duration {
        let st = grant.state();
        if st.lost.is_some() {
            Duration::ZERO
        } else if st.kept {
            drop(st);
            self.backend.kept_for(&grant.record)
        } else {
            (st.valid_until).saturating_duration_since(tokio::time::Instant::now())
        }
    }

    /// Gives back the last hold of a live grant (`lost`: of a grant already lost, which
    /// is given back if still ours and reported as lost). Cancelled mid-call, the release
    /// finishes in the background. `patiently`: in the background, where a failed call
    /// is tried again.
    ///
    /// A call Redis did not answer (unreachable, dropped, timed out; too few Redlock
    /// nodes) is returned as its error and tried again in the background, as a dropped
    /// guard's release: a blip then frees the lock within a second, not at the end of
    /// its lease.
    pub(crate) async fn release_last(
        self: &Arc<Self>,
        grant: &Arc<Grant<B>>,
        lost: Option<Loss>,
        patiently: bool,
    ) -> Result<Released, LockError> {
        self.watchdog.unschedule(grant);
        let background = cleanup::OnDrop::new(|| self.release_in_background(grant, lost));
        let reply = if patiently {
            give_back_patiently(&*self.backend, &grant.keys, &grant.record).await
        } else {
            self.backend.give_back(&grant.keys, &grant.record).await
        };
        match reply {
            // `background` fires on return: it counts the release and ends it in the
            // registry.
            // A grant already reported lost answers with its loss, as it does when the
            // store answers.
            Err(e) if !patiently && e.is_no_answer() => {
                Err(lost.map_or(e, |loss| loss.error(grant.keys.name())))
            }
            reply => {
                background.disarm();
                self.released(grant, lost, reply)
            }
        }
    }

    /// A store's answer to the release of `grant`'s last hold, as the caller sees it.
    fn released(
        &self,
        grant: &Arc<Grant<B>>,
        lost: Option<Loss>,
        reply: Result<Held, LockError>,
    ) -> Result<Released, LockError> {
        if lost.is_none() {
            self.registry.released(&grant.keys);
        }
        let name = grant.keys.name();
        let result = match (reply, lost) {
            (Err(e), _) => Err(e),
            (Ok(Ok(())), None) => {
                tracing::debug!(lock = %name, "lock released");
                Ok(Released::Unlocked)
            }
            (Ok(Ok(()) | Err(Loss::Expired)), Some(loss)) => Err(loss.error(name)),
            (Ok(Err(Loss::Expired)), None) => Err(self.lose(grant, Loss::Expired)),
            (Ok(Err(Loss::TakenOver)), _) => Err(self.lose(grant, Loss::TakenOver)),
        };
        grant.count_release(self.backend.kind(), &result);
        result
    }

    /// [`release_last`](Self::release_last) without waiting (a dropped guard): at once
    /// where the store can, else as a background task.
    pub(crate) fn release_in_background(
        self: &Arc<Self>,
        grant: &Arc<Grant<B>>,
        lost: Option<Loss>,
    ) {
        if let Some(reply) = self.backend.give_back_now(&grant.keys, &grant.record) {
            self.watchdog.unschedule(grant);
            let _ = self.released(grant, lost, Ok(reply));
            return;
        }
        let (core, grant) = (self.clone(), grant.clone());
        cleanup::spawn(
            "background release",
            grant.keys.name().to_owned(),
            async move { core.release_last(&grant, lost, true).await.map(|_| ()) },
        );
    }

    /// Gives back one hold of `grant` locally (see [`Registry::release`]). On a store
    /// that keeps its watched grants itself (memory), the last watched hold of a grant
    /// that other holds keep on a fixed lease leaves nothing keeping it: it runs out
    /// one watchdog lease from now, as on Redis once the renewals stop.
    pub(crate) fn release_hold(&self, grant: &Arc<Grant<B>>, watched: bool, remote: bool) -> Plan {
        let plan = self.registry.release(grant, watched, remote);
        if watched
            && matches!(plan, Plan::StillHeld(_))
            && !B::CAPABILITIES.renews
            && B::CAPABILITIES.fixed_leases
        {
            let mut st = grant.state();
            if st.kept && st.watched == 0 && st.lost.is_none() {
                st.kept = false;
                st.valid_until = tokio::time::Instant::now() + self.config().watchdog_lease();
                drop(st);
                self.backend.let_expire(&grant.keys, &grant.record);
            }
        }
        plan
    }

    /// Lets `grant` (its last hold given up) run out on its own: no release, no
    /// renewal. A store's lease then ends it; a session store has no lease to run out,
    /// so its grant is given back in the background.
    pub(crate) fn let_expire(&self, grant: &Arc<Grant<B>>) {
        self.watchdog.unschedule(grant);
        if B::CAPABILITIES.fixed_leases {
            self.backend.let_expire(&grant.keys, &grant.record);
            return;
        }
        let (backend, grant) = (self.backend.clone(), grant.clone());
        cleanup::spawn(
            "giving back a session lock",
            grant.keys.name().to_owned(),
            async move {
                backend
                    .give_back(&grant.keys, &grant.record)
                    .await
                    .map(drop)
            },
        );
    }

    /// Takes the fencing token of `grant` now (it was granted without one), unless it
    /// has one already; a lost grant gets its loss.
    pub(crate) async fn fence(&self, grant: &Arc<Grant<B>>) -> Result<FencingToken, LockError> {
        if !grant.keys.mode.is_fenced() {
            return Err(LockError::NoFencingToken {
                key: grant.keys.name().to_owned(),
                reason: "a read hold has no fencing token: readers write nothing",
            });
        }
        if let Some(loss) = grant.state().lost {
            return Err(loss.error(grant.keys.name()));
        }
        match self
            .backend
            .fence(&grant.keys, &grant.record, grant.seq)
            .await
        {
            // Two holds asking at once may both take one: the first one set stays.
            Ok(Ok(token)) => Ok(*grant.token.get_or_init(|| token)),
            Ok(Err(loss)) => Err(self.lose(grant, loss)),
            // A store that gives tokens with its grants cannot check one: past the lease
            // the client can prove, the grant is lost, as everywhere in the engine.
            Err(LockError::NoFencingToken { .. }) if grant.overdue(&grant.state()) => {
                Err(self.lose(grant, Loss::Expired))
            }
            Err(e) => Err(e),
        }
    }

    /// Lengthens the lease of `grant` to `lease` from now (the store never shortens a
    /// lease, so what any hold was told stays true).
    pub(crate) async fn extend_grant(
        &self,
        grant: &Arc<Grant<B>>,
        lease: Duration,
    ) -> Result<(), LockError> {
        let name = grant.keys.name();
        if let Some(loss) = grant.state().lost {
            return Err(loss.error(name));
        }
        let reply = self
            .backend
            .extend(&grant.keys, &grant.record, lease)
            .await?;
        match reply {
            Ok(valid_until) => {
                let mut st = grant.state();
                // Lost while the call was out (the watchdog's clock, a release of
                // another hold): a loss is final, whatever the store answered.
                if let Some(loss) = st.lost {
                    return Err(loss.error(name));
                }
                if !grant.lengthen(&mut st, valid_until) {
                    drop(st);
                    return Err(self.lose(grant, Loss::Expired));
                }
                drop(st);
                self.schedule(grant);
                Ok(())
            }
            Err(loss) => Err(self.lose(grant, loss)),
        }
    }

    /// Has the store keep `grant` until it is given back, as it keeps its watched
    /// grants (see [`Seam::keep`]).
    pub(crate) fn keep_grant(&self, grant: &Arc<Grant<B>>) -> Result<(), LockError> {
        if let Some(loss) = grant.state().lost {
            return Err(loss.error(grant.keys.name()));
        }
        if let Err(loss) = self.backend.keep(&grant.keys, &grant.record) {
            return Err(self.lose(grant, loss));
        }
        let mut st = grant.state();
        // Lost while the store was asked: a loss is final.
        if let Some(loss) = st.lost {
            return Err(loss.error(grant.keys.name()));
        }
        st.kept = true;
        Ok(())
    }

    /// Marks `grant` lost for `loss` and returns the matching error.
    fn lose(&self, grant: &Arc<Grant<B>>, loss: Loss) -> LockError {
        self.registry.lose(grant, loss);
        loss.error(grant.keys.name())
    }
}

impl<B: Seam> Drop for Core<B> {
    fn drop(&mut self) {
        // Let the watchdog task see the client is gone and exit.
        self.watchdog.stop();
    }
}
