//! What this client holds: one entry per (lock, owner), shared by all guards of that
//! owner, so reentrancy, renewal and the lost signal have a single source of truth.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::key::LockKeys;

/// One lock held (or being acquired) by one owner of this client.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) keys: LockKeys,
    pub(crate) owner: String,
    pub(crate) lost_tx: watch::Sender<bool>,
    state: Mutex<HeldState>,
}

#[derive(Debug)]
pub(crate) struct HeldState {
    /// Guards alive for this owner.
    pub(crate) holds: u32,
    /// Acquisitions sent to Redis whose answer is not in yet.
    pub(crate) pending: u32,
    /// Fencing token of the current grant (0 before the first).
    pub(crate) token: u64,
    /// Lease applied on grant and renewal.
    pub(crate) lease: Duration,
    /// Renewed by the watchdog (else a fixed lease).
    pub(crate) watchdog: bool,
    /// The lease is known to last at least until then (measured from before the request).
    pub(crate) valid_until: Instant,
    /// When the watchdog renews next (`None` for a fixed lease).
    pub(crate) next_renewal: Option<Instant>,
    /// Watchdog stops renewing after this (the max-hold cap).
    pub(crate) renew_until: Option<Instant>,
    /// Lost or released: detached from the registry, must not touch Redis state again.
    pub(crate) detached: bool,
}

impl Held {
    pub(crate) fn state(&self) -> MutexGuard<'_, HeldState> {
        // A poisoned lock only means another thread panicked mid-update; the counters
        // are still the best information we have.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fires the lost signal (once) and reports whether this call fired it.
    pub(crate) fn mark_lost(&self) -> bool {
        let mut st = self.state();
        st.detached = true;
        st.next_renewal = None;
        drop(st);
        !self.lost_tx.send_replace(true)
    }

    pub(crate) fn is_lost(&self) -> bool {
        *self.lost_tx.borrow()
    }
}

type Slot = (String, String);

/// All held entries of one client, by (lock hash key, owner).
#[derive(Debug, Default)]
pub(crate) struct Registry {
    map: Mutex<HashMap<Slot, Arc<Held>>>,
}

/// How to give back a hold in Redis, decided locally and synchronously.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleasePlan {
    /// Other local guards of this owner remain: drop one hold.
    One,
    /// The last local guard: drop every hold of this owner (delete + publish).
    All,
    /// The entry is detached (lost): only find out whether it expired or was taken.
    Peek,
}

impl Registry {
    fn map(&self) -> MutexGuard<'_, HashMap<Slot, Arc<Held>>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers an acquisition about to be sent; returns the entry and whether the owner
    /// already holds the lock locally (a re-entry).
    pub(crate) fn begin(&self, keys: &LockKeys, owner: &str, lease: Duration) -> (Arc<Held>, bool) {
        let mut map = self.map();
        let slot = (keys.hash.clone(), owner.to_owned());
        let held = map
            .entry(slot)
            .or_insert_with(|| Self::fresh(keys, owner, lease))
            .clone();
        let mut st = held.state();
        st.pending += 1;
        let reentry = st.holds > 0;
        drop(st);
        (held, reentry)
    }

    /// The acquisition did not grant (busy, error, cancelled). Returns true when nothing
    /// of this owner is held or pending any more, so an ambiguous request must be undone.
    pub(crate) fn abort(&self, held: &Arc<Held>) -> bool {
        let mut map = self.map();
        {
            let mut st = held.state();
            st.pending = st.pending.saturating_sub(1);
        }
        let slot = (held.keys.hash.clone(), held.owner.clone());
        let Some(current) = map.get(&slot).cloned() else {
            return true;
        };
        let mut st = current.state();
        let idle = st.holds == 0 && st.pending == 0;
        if idle {
            st.detached = true;
            drop(st);
            map.remove(&slot);
        }
        idle
    }

    /// The acquisition was granted, but the entry it started from no longer stands for
    /// the grant (it was lost meanwhile, or Redis made a fresh grant while old guards
    /// still live): fire the old entry's lost signal and attach a fresh one.
    pub(crate) fn renew_entry(&self, old: &Arc<Held>) -> Arc<Held> {
        let mut map = self.map();
        let mut st = old.state();
        let lease = st.lease;
        st.pending = st.pending.saturating_sub(1);
        st.detached = true;
        st.next_renewal = None;
        drop(st);
        old.lost_tx.send_replace(true);
        let fresh = Self::fresh(&old.keys, &old.owner, lease);
        fresh.state().pending = 1;
        map.insert((old.keys.hash.clone(), old.owner.clone()), fresh.clone());
        fresh
    }

    /// Detaches a lost entry so later acquisitions by the same owner start afresh.
    pub(crate) fn detach(&self, held: &Arc<Held>) {
        let mut map = self.map();
        Self::remove_if_same(&mut map, held);
    }

    /// Gives back one local hold and says what Redis must be told.
    pub(crate) fn release(&self, held: &Arc<Held>) -> ReleasePlan {
        let mut map = self.map();
        let mut st = held.state();
        st.holds = st.holds.saturating_sub(1);
        if st.detached {
            return ReleasePlan::Peek;
        }
        if st.holds > 0 || st.pending > 0 {
            return ReleasePlan::One;
        }
        st.detached = true;
        st.next_renewal = None;
        drop(st);
        Self::remove_if_same(&mut map, held);
        ReleasePlan::All
    }

    /// Every attached entry (for the watchdog).
    pub(crate) fn snapshot(&self) -> Vec<Arc<Held>> {
        self.map().values().cloned().collect()
    }

    /// Number of attached entries (locks held or being acquired).
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    fn fresh(keys: &LockKeys, owner: &str, lease: Duration) -> Arc<Held> {
        Arc::new(Held {
            keys: keys.clone(),
            owner: owner.to_owned(),
            lost_tx: watch::Sender::new(false),
            state: Mutex::new(HeldState {
                holds: 0,
                pending: 0,
                token: 0,
                lease,
                watchdog: false,
                valid_until: Instant::now(),
                next_renewal: None,
                renew_until: None,
                detached: false,
            }),
        })
    }

    fn remove_if_same(map: &mut HashMap<Slot, Arc<Held>>, held: &Arc<Held>) {
        let slot = (held.keys.hash.clone(), held.owner.clone());
        if map.get(&slot).is_some_and(|h| Arc::ptr_eq(h, held)) {
            map.remove(&slot);
        }
    }
}
