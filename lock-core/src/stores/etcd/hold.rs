//! One contender key of ours: held ([`EtcdHold`], with the watch that reports its
//! deletion), or on its way in ([`Leave`], which takes it out again if the attempt
//! does not keep it).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::contender;
use super::members::Members;
use super::session::Lease;
use super::turns::Turn;
use crate::client::cleanup;
use crate::client::config::Backoff;
use crate::error::LockError;
use crate::lock::registry::Loss;

/// One held contender key.
pub(crate) struct EtcdHold {
    pub(super) key: String,
    pub(super) lease: Lease,
    /// The key's create revision: the fencing token.
    pub(super) token: i64,
    /// This client's turn on the name, passed on once the key is given back or found
    /// deleted.
    turn: Mutex<Option<Turn>>,
    /// Set before we delete the key ourselves: its deletion is then no loss.
    given_back: AtomicBool,
}

impl EtcdHold {
    pub(super) fn new(key: String, lease: Lease, token: i64, turn: Turn) -> Self {
        Self {
            key,
            lease,
            token,
            turn: Mutex::new(Some(turn)),
            given_back: AtomicBool::new(false),
        }
    }

    /// Deletes our key: `Ok` if it was still there. Safe to repeat. When no member
    /// answers, the error is returned and the delete goes on in the background (see
    /// [`delete_in_background`]).
    pub(super) async fn give_back(
        &self,
        members: &Arc<Members>,
    ) -> Result<Result<(), Loss>, LockError> {
        self.given_back.store(true, Ordering::Release);
        let deleted = contender::delete(members, &self.key, Some(self.token)).await;
        let turn = self.take_turn();
        match deleted {
            Ok(deleted) => {
                drop(turn);
                Ok(if deleted { Ok(()) } else { Err(Loss::Expired) })
            }
            Err(e) => {
                let (members, key) = (members.clone(), self.key.clone());
                delete_in_background(members, key, Some(self.token), turn, self.lease.ttl);
                Err(e)
            }
        }
    }

    /// This client's turn on the name, to pass on (dropped) once the key is gone.
    fn take_turn(&self) -> Option<Turn> {
        self.turn.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn given_back(&self) -> bool {
        self.given_back.load(Ordering::Acquire)
    }
}

/// Resolves with the loss of `hold` once its key is deleted by anyone but us (by hand,
/// or with its lease), or with `None` once we give it back or drop it.
///
/// It starts watching only `after` the grant (a hold given back sooner costs no watch),
/// from the key's creation on, so a deletion meanwhile is found then. One watch lasts
/// as long as it answers, looked at by one read only when it ends, and made again
/// then (at least `recheck / 4` apart); every `recheck` the task only asks whether the
/// hold is still ours. A watch whose member stopped answering reports nothing: the
/// watchdog's renewal, which reads the key anyway, finds the deletion then.
pub(super) fn deletion(
    members: Arc<Members>,
    hold: &Arc<EtcdHold>,
    after: Duration,
    recheck: Duration,
) -> impl Future<Output = Option<Loss>> + Send + 'static {
    let hold = Arc::downgrade(hold);
    async move {
        tokio::time::sleep(after).await;
        loop {
            let started = Instant::now();
            let (key, created) = still_ours(&hold)?;
            let watch = contender::await_deletion(&members, (key.as_bytes(), created), created);
            tokio::pin!(watch);
            let watched = loop {
                tokio::select! {
                    watched = &mut watch => break watched,
                    () = tokio::time::sleep(recheck) => {
                        still_ours(&hold)?;
                    }
                }
            };
            still_ours(&hold)?;
            let gone = match watched {
                Ok(()) => contender::is_there(&members, key.as_bytes(), created)
                    .await
                    .is_ok_and(|there| !there),
                Err(_) => false,
            };
            if gone {
                let loss = still_ours(&hold).map(|_| Loss::Expired);
                // The key is gone, so another scope of this client may make it anew:
                // the lost guard's own give-back deletes only its revision.
                if let Some(hold) = hold.upgrade() {
                    drop(hold.take_turn());
                }
                return loss;
            }
            // The watch ended with the key there, or the store failed: not in a tight loop.
            tokio::time::sleep_until(started + recheck / 4).await;
        }
    }
}

/// `hold`'s key and create revision while it is held and not given back.
fn still_ours(hold: &Weak<EtcdHold>) -> Option<(String, i64)> {
    let hold = hold.upgrade()?;
    (!hold.given_back()).then(|| (hold.key.clone(), hold.token))
}

/// The pauses between the tries of [`delete_in_background`].
const DELETE_RETRY: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(1),
};

/// Deletes our `key` (only the grant made at revision `created`, when given) in the
/// background, tried again until a member answers, then passes `turn` on: until then the
/// client's other scopes wait for the name, so none of them takes the key as its own.
/// The session's lease would not free the key while the client holds other locks, as it
/// keeps that lease alive. It gives up after two leases of `ttl`: without an answer that
/// long, the session's keep-alives failed too, and its lease (the key with it) is gone.
fn delete_in_background(
    members: Arc<Members>,
    key: String,
    created: Option<i64>,
    turn: Option<Turn>,
    ttl: Duration,
) {
    cleanup::spawn("removing an etcd contender key", key.clone(), async move {
        let until = Instant::now() + ttl * 2;
        let mut failed = 0;
        let deleted = loop {
            let pause = DELETE_RETRY.delay(failed);
            match contender::delete(&members, &key, created).await {
                Err(e) if Instant::now() + pause < until => {
                    tracing::debug!(key = %key, error = %e, "deleting an etcd contender key failed; trying again");
                    tokio::time::sleep(pause).await;
                    failed += 1;
                }
                deleted => break deleted,
            }
        };
        drop(turn);
        deleted.map(drop)
    });
}

/// Until kept, dropping this deletes our key in the background (an attempt cancelled
/// or failed with its create in flight may have made it), then passes the turn on.
pub(super) struct Leave {
    members: Arc<Members>,
    key: String,
    /// The session lease's TTL, which bounds the deletion in the background.
    ttl: Duration,
    /// Our key's create revision, once known: the deletes are of that key only (one
    /// delivered late by a member that hung must not take a key another scope of this
    /// client made since under the same name).
    created: Option<i64>,
    turn: Option<Turn>,
}

impl Leave {
    /// Armed before the create of `key` under a lease of `ttl`: a cancelled or failed
    /// attempt may have made it.
    pub(super) fn arm(members: Arc<Members>, key: String, ttl: Duration, turn: Turn) -> Self {
        Self {
            members,
            key,
            ttl,
            created: None,
            turn: Some(turn),
        }
    }

    /// Our key was made at revision `created`.
    pub(super) fn made(&mut self, created: i64) {
        self.created = Some(created);
    }

    pub(super) fn keep(mut self) -> Turn {
        self.turn.take().expect("a leave keeps its turn until kept")
    }

    /// Deletes our key now (a busy or timed-out attempt), then passes the turn on.
    pub(super) async fn now(mut self) -> Result<(), LockError> {
        let turn = self.turn.take();
        let deleted = contender::delete(&self.members, &self.key, self.created).await;
        if deleted.is_err() {
            // Not known deleted: leave it to the background, turn and all.
            self.turn = turn;
        }
        deleted.map(drop)
    }
}

impl Drop for Leave {
    fn drop(&mut self) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        let (members, key) = (self.members.clone(), self.key.clone());
        delete_in_background(members, key, self.created, Some(turn), self.ttl);
    }
}
