//! `Core`: what a client and its guards share (the backend, the registry, the
//! watchdog), and the engine's side of a release, a fence and an extension.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::backend::RedisBackend;
use super::registry::{Grant, Loss, Registry};
use super::watchdog::Watchdog;
use crate::client::Client;
use crate::client::cleanup;
use crate::client::config::{LockConfig, drift};
use crate::client::store::scripts::{FenceReply, GrantReply};
use crate::error::LockError;
use crate::lock::Released;
use crate::owner::FencingToken;
use crate::owner::{LockScope, push_digits};

pub(crate) struct Core {
    pub(crate) backend: RedisBackend,
    pub(crate) registry: Arc<Registry>,
    pub(crate) watchdog: Watchdog,
    grants: AtomicU64,
}

impl Core {
    pub(crate) fn new(client: Client) -> Self {
        let registry = Arc::new(Registry::default());
        let backend = RedisBackend::new(client);
        Self {
            watchdog: Watchdog::new(backend.clone(), registry.clone()),
            backend,
            registry,
            grants: AtomicU64::new(1),
        }
    }

    pub(crate) fn client(&self) -> &Client {
        self.backend.client()
    }

    pub(crate) fn config(&self) -> &LockConfig {
        self.client().config()
    }

    /// A value and a number for a new grant: unique per grant (this client's random id
    /// and a counter), so a release or renewal can only touch its own grant.
    pub(crate) fn next_grant(&self, scope: &LockScope) -> (String, u64) {
        let seq = self.grants.fetch_add(1, Ordering::Relaxed);
        let id = self.client().id_hex();
        // `<owner>:<grant number>`: the owner id is recovered from it (`Grant::owner`).
        let mut value = String::with_capacity(id.len() + 38);
        scope.write_owner(id, &mut value);
        value.push(':');
        push_digits(&mut value, seq, 16);
        (value, seq)
    }

    /// Fencing token `token` of this client's grant number `seq`. Its holder id is
    /// distinct for every grant of this client (an odd multiplier is a bijection) and
    /// unrelated between clients (their ids are random).
    pub(crate) fn token(&self, seq: u64, token: u64) -> FencingToken {
        let holder = self.client().id().low64() ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        FencingToken::new(token, holder)
    }

    /// Gives back the last hold of a live grant (`lost`: of a grant already lost, which
    /// is deleted if still ours and reported as lost). Cancelled mid-call, the release
    /// finishes in the background. `patiently`: in the background, where a failed call
    /// is tried again.
    pub(crate) async fn release_last(
        self: &Arc<Self>,
        grant: &Arc<Grant>,
        lost: Option<Loss>,
        patiently: bool,
    ) -> Result<Released, LockError> {
        self.watchdog.unschedule(grant);
        let background = cleanup::OnDrop::new(|| self.release_in_background(grant, lost));
        let reply = if patiently {
            self.backend
                .give_back_patiently(&grant.keys, &grant.value)
                .await
        } else {
            self.backend.give_back(&grant.keys, &grant.value).await
        };
        background.disarm();
        if lost.is_none() {
            self.registry.released(&grant.keys.key);
        }
        let name = &grant.keys.name;
        let result = match (reply, lost) {
            (Err(e), _) => Err(e),
            (Ok(GrantReply::Done), None) => {
                tracing::debug!(lock = %name, "lock released");
                Ok(Released::Unlocked)
            }
            (Ok(GrantReply::Done), Some(loss)) | (Ok(GrantReply::Expired), Some(loss)) => {
                Err(loss.error(name))
            }
            (Ok(GrantReply::Expired), None) => Err(self.lose(grant, Loss::Expired)),
            (Ok(GrantReply::NotOwner), _) => Err(self.lose(grant, Loss::TakenOver)),
        };
        grant.count_release(&result, true);
        result
    }

    /// [`release_last`](Self::release_last) as a background task (a dropped guard).
    pub(crate) fn release_in_background(self: &Arc<Self>, grant: &Arc<Grant>, lost: Option<Loss>) {
        let (core, grant) = (self.clone(), grant.clone());
        cleanup::spawn("background release", grant.keys.name.clone(), async move {
            core.release_last(&grant, lost, true).await.map(|_| ())
        });
    }

    /// Takes the fencing token of `grant` now (it was granted without one), unless it
    /// has one already; a lost grant gets its loss.
    pub(crate) async fn fence(&self, grant: &Arc<Grant>) -> Result<FencingToken, LockError> {
        if let Some(loss) = grant.state().lost {
            return Err(loss.error(&grant.keys.name));
        }
        let reply = self.backend.fence(&grant.keys, &grant.value).await?;
        match reply {
            // Two holds asking at once may both take one: the first one set stays.
            FenceReply::Token(t) => Ok(*grant.token.get_or_init(|| self.token(grant.seq, t))),
            FenceReply::Lost(GrantReply::NotOwner) => Err(self.lose(grant, Loss::TakenOver)),
            FenceReply::Lost(_) => Err(self.lose(grant, Loss::Expired)),
        }
    }

    /// Lengthens the lease of `grant` to `lease` from now (one renew call; the script
    /// never shortens a lease, so what any hold was told stays true).
    pub(crate) async fn extend_grant(
        &self,
        grant: &Arc<Grant>,
        lease: Duration,
    ) -> Result<(), LockError> {
        let name = &grant.keys.name;
        if let Some(loss) = grant.state().lost {
            return Err(loss.error(name));
        }
        let sent = Instant::now();
        let reply = self
            .backend
            .extend(&grant.keys, &grant.value, lease)
            .await?;
        match reply {
            GrantReply::Done => {
                let mut st = grant.state();
                if st.lost.is_none() {
                    st.valid_until = st.valid_until.max(sent + lease - drift(lease));
                }
                drop(st);
                self.watchdog.schedule(grant);
                Ok(())
            }
            GrantReply::Expired => Err(self.lose(grant, Loss::Expired)),
            GrantReply::NotOwner => Err(self.lose(grant, Loss::TakenOver)),
        }
    }

    /// Marks `grant` lost for `loss` and returns the matching error.
    fn lose(&self, grant: &Arc<Grant>, loss: Loss) -> LockError {
        self.registry.lose(grant, loss);
        loss.error(&grant.keys.name)
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // Let the watchdog task see the client is gone and exit.
        self.watchdog.stop();
    }
}
