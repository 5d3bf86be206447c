//! `Core`: what a client and its guards share (connection, registry, watchdog, waiters),
//! and the lock protocol's Redis calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::registry::{Grant, Loss, Registry};
use super::watchdog::Watchdog;
use crate::client::Client;
use crate::client::cleanup;
use crate::client::config::{LockConfig, drift};
use crate::client::store::Conn;
use crate::client::store::batch::Entry;
use crate::client::store::key::{LockKeys, RELEASED, WAITERS};
use crate::client::store::scripts::{FENCE, FenceReply, GrantReply, RELEASE, RENEW, codes};
use crate::error::LockError;
use crate::fencing::FencingToken;
use crate::lock::Released;
use crate::owner::{LockScope, push_digits};

pub(crate) struct Core {
    pub(crate) client: Client,
    pub(crate) registry: Arc<Registry>,
    pub(crate) watchdog: Watchdog,
    grants: AtomicU64,
}

impl Core {
    pub(crate) fn new(client: Client) -> Self {
        let registry = Arc::new(Registry::default());
        Self {
            watchdog: Watchdog::new(
                client.conn().clone(),
                client.kind(),
                registry.clone(),
                client.config(),
            ),
            client,
            registry,
            grants: AtomicU64::new(1),
        }
    }

    pub(crate) fn conn(&self) -> &Conn {
        self.client.conn()
    }

    pub(crate) fn config(&self) -> &LockConfig {
        self.client.config()
    }

    /// A value and a number for a new grant: unique per grant (this client's random id
    /// and a counter), so a release or renewal can only touch its own grant.
    pub(crate) fn next_grant(&self, scope: &LockScope) -> (String, u64) {
        let seq = self.grants.fetch_add(1, Ordering::Relaxed);
        let id = self.client.id_hex();
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
        let holder = self.client.id().low64() ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        FencingToken::new(token, holder)
    }

    /// Deletes the grant with value `value` if the lock still holds it
    /// (compare-and-delete; publishes if someone waits, and wakes this client's
    /// waiters). Used by releases and by the undo of an unfinished acquisition.
    pub(crate) async fn delete_call(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<GrantReply, LockError> {
        let reply = self
            .conn()
            .call(&RELEASE, &keys.key, || {
                Entry::new()
                    .key(&keys.key)
                    .key_suffixed(&keys.key, WAITERS)
                    .key_suffixed(&keys.key, RELEASED)
                    .arg(value)
                    .arg(self.client.id_hex())
            })
            .await?;
        let r = GrantReply::decode("release", reply)?;
        if r == GrantReply::Done && self.client.hub().has_local_waiters() {
            self.client.hub().notify_local(&keys.channel());
        }
        Ok(r)
    }

    /// [`delete_call`](Self::delete_call) for background work, tried again after a
    /// failure ([`cleanup::patiently`]: it deletes only this grant's own value). After a
    /// failed try, `Expired` means that try may have deleted it: reported as done.
    pub(crate) async fn delete_call_patiently(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<GrantReply, LockError> {
        match cleanup::patiently("a background delete", || self.delete_call(keys, value)).await {
            (Ok(GrantReply::Expired), true) => Ok(GrantReply::Done),
            (answer, _) => answer,
        }
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
            self.delete_call_patiently(&grant.keys, &grant.value).await
        } else {
            self.delete_call(&grant.keys, &grant.value).await
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
        let keys = &grant.keys;
        let reply = self
            .conn()
            .eval(&FENCE, self.conn().timeout(), |c| {
                c.arg(2).arg(&keys.key).arg(keys.fence()).arg(&grant.value);
            })
            .await?;
        match FenceReply::decode(reply)? {
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
            .conn()
            .eval(&RENEW, self.conn().timeout(), |c| {
                c.arg(1)
                    .arg(&grant.keys.key)
                    .arg(&grant.value)
                    .arg(lease.as_millis() as u64);
            })
            .await?;
        let code = codes("renew", reply, 1)?[0];
        match GrantReply::from_code("renew", code)? {
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
