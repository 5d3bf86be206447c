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
use crate::error::LockError;
use crate::lock::registry::Loss;

/// One held contender key.
pub(crate) struct EtcdHold {
    pub(super) key: String,
    pub(super) lease: Lease,
    /// The key's create revision: the fencing token.
    pub(super) token: i64,
    /// This client's turn on the name, passed on once the key is known deleted.
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

    /// Deletes our key: `Ok` if it was still there. Safe to repeat.
    pub(super) async fn give_back(&self, members: &Members) -> Result<Result<(), Loss>, LockError> {
        self.given_back.store(true, Ordering::Release);
        let deleted = contender::delete(members, &self.key).await?;
        let turn = self.turn.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(turn);
        Ok(if deleted { Ok(()) } else { Err(Loss::Expired) })
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
                return still_ours(&hold).map(|_| Loss::Expired);
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

/// Until kept, dropping this deletes our key in the background (an attempt cancelled
/// or failed with its create in flight may have made it), then passes the turn on.
pub(super) struct Leave {
    members: Arc<Members>,
    key: String,
    turn: Option<Turn>,
}

impl Leave {
    /// Armed before the create of `key`: a cancelled or failed attempt may have made it.
    pub(super) fn arm(members: Arc<Members>, key: String, turn: Turn) -> Self {
        Self {
            members,
            key,
            turn: Some(turn),
        }
    }

    pub(super) fn keep(mut self) -> Turn {
        self.turn.take().expect("a leave keeps its turn until kept")
    }

    /// Deletes our key now (a busy or timed-out attempt), then passes the turn on.
    pub(super) async fn now(mut self) -> Result<(), LockError> {
        let turn = self.turn.take();
        let deleted = contender::delete(&self.members, &self.key).await;
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
        cleanup::spawn("removing an etcd contender key", key.clone(), async move {
            let done = cleanup::patiently("removing an etcd contender key", || {
                contender::delete(&members, &key)
            })
            .await;
            drop(turn);
            done.0.map(drop)
        });
    }
}
