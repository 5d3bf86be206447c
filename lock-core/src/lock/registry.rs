//! What this client holds: one [`Grant`] per lock granted by the store, shared by every
//! hold of its owner (scope), so reentrancy, renewal and the lost signal have one source
//! of truth, and a re-entry costs no round trip.
//!
//! Time is tokio's clock (the same as the system's, except on a paused test runtime,
//! where the memory store follows it).
//!
//! The registry also knows which acquisitions are in flight (a second acquisition of
//! the same scope waits for the first instead of racing it) and which releases are in
//! flight (an acquisition of a lock this client is still giving back waits for that,
//! instead of finding its own old grant busy).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;
use tokio::time::Instant;

use super::seam::{Granted, Seam, Validity};

use crate::client::store::key::{LockKeys, LockMode};
use crate::error::LockError;
use crate::lock::release_outcome;
use crate::metrics::{self, Primitive, Series, StoreKind};
use crate::owner::FencingToken;

/// Why a grant was lost, as far as this client knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Loss {
    /// The lease ran out (by the local clock, or the store had no grant any more).
    Expired,
    /// The store showed another grant.
    TakenOver,
}

impl Loss {
    pub(crate) fn error(self, key: &str) -> LockError {
        let key = key.to_owned();
        match self {
            Self::Expired => LockError::Expired { key },
            Self::TakenOver => LockError::NotOwner { key },
        }
    }
}

/// One grant: what one successful acquisition took in the store.
pub(crate) struct Grant<B: Seam> {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) scope: u64,
    /// The store's record of it (on Redis, the value: `<owner>:<grant number>`).
    pub(crate) record: B::Grant,
    /// The fencing token, once taken (with the grant, or on demand).
    pub(crate) token: std::sync::OnceLock<FencingToken>,
    /// Unique per grant in this client (the watchdog's queue key).
    pub(crate) seq: u64,
    /// When its reply arrived: the start of its hold time.
    pub(crate) granted: Instant,
    /// What it is for: the metrics' label.
    pub(crate) primitive: Primitive,
    /// Woken when the grant is lost (its guards' `lost()` wait on it).
    pub(crate) lost_wake: Notify,
    state: Mutex<GrantState>,
}

#[derive(Debug)]
pub(crate) struct GrantState {
    /// Holds (guards) alive.
    pub(crate) holds: u32,
    /// Holds that asked for the watchdog lease.
    pub(crate) watched: u32,
    /// The store keeps it while held and reports its validity (no local lease): from
    /// the grant on, or since a watched hold re-entered it on a store that keeps its
    /// watched grants itself.
    pub(crate) kept: bool,
    /// The lease is known to last at least until then (measured from before the
    /// request that set it, less the drift allowance).
    pub(crate) valid_until: Instant,
    /// When the watchdog renews next (`None`: no watched hold, or the max-hold cap).
    pub(crate) next_renewal: Option<Instant>,
    /// The watchdog stops renewing after this (the max-hold cap).
    pub(crate) renew_until: Option<Instant>,
    /// A renewal call is in flight.
    pub(crate) renewing: bool,
    /// Released (last hold gone) or lost: nothing local may touch it again.
    pub(crate) ended: bool,
    /// Lost, and why.
    pub(crate) lost: Option<Loss>,
    /// Where the grant sits in the watchdog's queue.
    pub(crate) queued: Option<Queued>,
}

/// A grant's current entry in the watchdog's queue: its due time, and whether it is in
/// the queue's line (where a released grant's entry stays until it comes due).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queued {
    pub(crate) at: Instant,
    pub(crate) in_line: bool,
}

impl<B: Seam> std::fmt::Debug for Grant<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("lock", &self.keys.name())
            .field("scope", &self.scope)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl<B: Seam> Grant<B> {
    pub(crate) fn new(
        keys: Arc<LockKeys>,
        scope: u64,
        primitive: Primitive,
        taken: Granted<B::Grant>,
    ) -> Self {
        let (valid_until, kept) = match taken.valid {
            Validity::Until(until) => (until, false),
            Validity::Kept => (taken.arrived, true),
        };
        Self {
            keys,
            scope,
            record: taken.grant,
            token: taken
                .token
                .map(std::sync::OnceLock::from)
                .unwrap_or_default(),
            seq: taken.seq,
            granted: taken.arrived,
            primitive,
            lost_wake: Notify::new(),
            state: Mutex::new(GrantState {
                holds: 1,
                watched: 0,
                kept,
                valid_until,
                next_renewal: None,
                renew_until: None,
                renewing: false,
                ended: false,
                lost: None,
                queued: None,
            }),
        }
    }

    /// Whether the lease this client can prove ran out, with nobody having noticed yet
    /// (the watchdog may be late, and some stores have none).
    pub(crate) fn overdue(&self, st: &GrantState) -> bool {
        self.overdue_at(st, Instant::now())
    }

    fn overdue_at(&self, st: &GrantState, now: Instant) -> bool {
        !st.kept && st.lost.is_none() && now >= st.valid_until
    }

    /// Takes a store's answer (a renewal or an extension) that the grant holds until
    /// `valid_until`, `st` being its locked state; never shortens what it was told.
    /// False when the answer came after the lease the client could prove ran out:
    /// `lost()` may have fired by then and a loss is final, so the caller marks the
    /// grant lost instead.
    pub(crate) fn lengthen(&self, st: &mut GrantState, valid_until: Instant) -> bool {
        if self.overdue(st) {
            return false;
        }
        if st.lost.is_none() {
            st.valid_until = st.valid_until.max(valid_until);
        }
        true
    }

    /// Counts the release of one hold that returned `result`.
    pub(crate) fn count_release(
        &self,
        store: StoreKind,
        result: &Result<crate::Released, LockError>,
    ) {
        metrics::released(self.series(store), release_outcome(result));
    }

    /// The metrics' labels of this grant on `store`.
    fn series(&self, store: StoreKind) -> Series {
        Series {
            store,
            primitive: self.primitive,
        }
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, GrantState> {
        // A poisoned lock only means another thread panicked mid-update; the fields
        // are still the best information we have.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// True once the lost signal fired.
    #[cfg(test)]
    pub(crate) fn is_lost(&self) -> bool {
        self.state().lost.is_some()
    }
}

/// What a caller about to acquire must do.
pub(crate) enum Enter<'a, B: Seam> {
    /// The scope holds the lock: one more hold was counted on this grant.
    Reentered(Arc<Grant<B>>),
    /// Wait for this, then ask again: the same scope is acquiring it right now
    /// (`own_release == false`), or this client is still giving back a grant of it.
    Wait {
        ready: Pin<Box<OwnedNotified>>,
        own_release: bool,
    },
    /// Go to the store; the ticket stands for the acquisition in flight.
    Acquire(Ticket<'a, B>),
    /// Not this way: what the scope holds of a read-write lock rules it out.
    Refused(LockError),
}

/// How to give back one hold, decided locally.
#[derive(Debug)]
pub(crate) enum Plan {
    /// Other holds remain: nothing to tell the store.
    StillHeld(u32),
    /// The grant was lost and other holds remain.
    Lost(Loss),
    /// The last hold of a live grant: give it back to the store.
    Last,
    /// The last hold of a lost grant: give it back if the store still has it, and
    /// report the loss.
    LastLost(Loss),
}

enum Slot<B: Seam> {
    /// An acquisition in flight, and the wake-up of those waiting for it (made when
    /// the first one comes: most acquisitions have no one waiting).
    Acquiring(Option<Arc<Notify>>),
    Held(Arc<Grant<B>>),
}

/// A lock key and a scope; shares the request's keys instead of copying the name.
struct SlotKey {
    keys: Arc<LockKeys>,
    scope: u64,
}

impl SlotKey {
    fn new(keys: &Arc<LockKeys>, scope: u64) -> Self {
        Self {
            keys: keys.clone(),
            scope,
        }
    }
}

impl PartialEq for SlotKey {
    fn eq(&self, other: &Self) -> bool {
        // A read and a write hold of one name share the key: the mode tells them apart.
        self.scope == other.scope
            && self.keys.hash == other.keys.hash
            && self.keys.key == other.keys.key
            && self.keys.mode == other.keys.mode
    }
}

impl Eq for SlotKey {}

impl Hash for SlotKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The key's own hash is seeded; the scope, a number of ours, spreads over it.
        state.write_u64(self.keys.hash ^ self.scope.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
}

/// A lock key, compared as its key string and hashed as [`LockKeys::hash`].
struct ByKey(Arc<LockKeys>);

impl PartialEq for ByKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.hash == other.0.hash && self.0.key == other.0.key
    }
}

impl Eq for ByKey {}

impl Hash for ByKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

/// The hasher of the registry's maps: their keys come hashed already (see
/// [`LockKeys::hash`]), so it passes that hash on.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not reached: both keys write one u64. Still a hash, should that change.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
}

/// A releasing count and the wake-up of acquisitions waiting for it (made when the
/// first one comes).
type Releasing = (u32, Option<Arc<Notify>>);

/// Keyed by strings users choose, held only while in use, and hashed once per call with
/// a per-process seed against chosen collisions (see [`LockKeys::hash`]).
type Map<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<Prehashed>>;

struct Maps<B: Seam> {
    slots: Map<SlotKey, Slot<B>>,
    /// Releases in flight, by lock key.
    releasing: Map<ByKey, Releasing>,
}

/// Every grant and in-flight acquisition of one client.
pub(crate) struct Registry<B: Seam> {
    maps: Mutex<Maps<B>>,
    /// The `store` label of its metrics.
    kind: StoreKind,
}

impl<B: Seam> Registry<B> {
    pub(crate) fn new(kind: StoreKind) -> Self {
        Self {
            maps: Mutex::new(Maps {
                slots: Map::default(),
                releasing: Map::default(),
            }),
            kind,
        }
    }
}

impl<B: Seam> std::fmt::Debug for Registry<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("entries", &self.len())
            .finish()
    }
}

/// A wake-up armed now (so a notification sent after this returns is not missed),
/// made in `slot` if no one waited before.
fn armed(slot: &mut Option<Arc<Notify>>) -> Pin<Box<OwnedNotified>> {
    let notify = slot.get_or_insert_with(|| Arc::new(Notify::new()));
    let mut ready = Box::pin(notify.clone().notified_owned());
    ready.as_mut().enable();
    ready
}

impl<B: Seam> Registry<B> {
    fn maps(&self) -> MutexGuard<'_, Maps<B>> {
        self.maps.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-enters the grant `scope` holds on `key`, or says what to wait for, or
    /// registers an acquisition. `watched`: the new hold wants the watchdog lease.
    pub(crate) fn enter(&self, keys: &Arc<LockKeys>, scope: u64, watched: bool) -> Enter<'_, B> {
        let mut maps = self.maps();
        if keys.mode.is_read_write()
            && let Some(refused) = Self::mode_refused(&maps, keys, scope)
        {
            return Enter::Refused(refused);
        }
        let Maps { slots, releasing } = &mut *maps;
        let slot_key = SlotKey::new(keys, scope);
        // One lookup: the slot found, or the place a new one goes.
        let place = match slots.entry(slot_key) {
            Entry::Occupied(mut e) => match e.get_mut() {
                Slot::Held(grant) => {
                    let mut st = grant.state();
                    if grant.overdue(&st) {
                        // Its lease ran out unnoticed: lost, and the scope takes a
                        // fresh grant.
                        let grant = grant.clone();
                        drop(st);
                        drop(maps);
                        self.lose(&grant, Loss::Expired);
                        return self.enter(keys, scope, watched);
                    }
                    if !st.ended {
                        st.holds += 1;
                        if watched {
                            st.watched += 1;
                        }
                        drop(st);
                        return Enter::Reentered(grant.clone());
                    }
                    drop(st);
                    // Ended but not yet removed: replaced by this acquisition.
                    Entry::Occupied(e)
                }
                Slot::Acquiring(notify) => {
                    return Enter::Wait {
                        ready: armed(notify),
                        own_release: false,
                    };
                }
            },
            vacant => vacant,
        };
        if !releasing.is_empty()
            && let Some((_, notify)) = releasing.get_mut(&ByKey(keys.clone()))
        {
            // (An entry left unused changes nothing.)
            return Enter::Wait {
                ready: armed(notify),
                own_release: true,
            };
        }
        place.insert_entry(Slot::Acquiring(None));
        Enter::Acquire(Ticket {
            registry: self,
            slot_key: Some(SlotKey::new(keys, scope)),
        })
    }

    /// Why `scope` may not take `keys` (a read or write hold) given what it holds of
    /// the same read-write lock: a write hold asked under its own read hold waits for
    /// itself; a read hold under its own write hold only where the store downgrades.
    fn mode_refused(maps: &Maps<B>, keys: &Arc<LockKeys>, scope: u64) -> Option<LockError> {
        let holds = |mode| {
            let mut twin = (**keys).clone();
            twin.mode = mode;
            let twin = SlotKey::new(&Arc::new(twin), scope);
            matches!(maps.slots.get(&twin), Some(Slot::Held(g)) if !g.state().ended)
        };
        let other = match keys.mode {
            // A writer that also reads (a downgrade) re-enters its write hold.
            LockMode::Write if !holds(LockMode::Write) => LockMode::Read,
            LockMode::Read if !B::CAPABILITIES.downgrade => LockMode::Write,
            _ => return None,
        };
        holds(other).then(|| match other {
            LockMode::Read => LockError::Upgrade {
                key: keys.name().to_owned(),
            },
            _ => LockError::Unsupported {
                key: keys.name().to_owned(),
                reason: "this store cannot give a read hold to the scope holding the write hold",
            },
        })
    }

    /// Gives back one hold of `grant` and says what Redis must be told. With
    /// `remote`, the caller will delete the grant in Redis: acquisitions of the same
    /// lock by this client wait until it calls [`released`](Self::released).
    pub(crate) fn release(&self, grant: &Arc<Grant<B>>, watched: bool, remote: bool) -> Plan {
        let mut maps = self.maps();
        let mut st = grant.state();
        let now = Instant::now();
        if grant.overdue_at(&st, now) {
            drop((st, maps));
            self.lose(grant, Loss::Expired);
            maps = self.maps();
            st = grant.state();
        }
        st.holds = st.holds.saturating_sub(1);
        if st.holds == 0 && remote {
            // The hold ends here, when it is let go, whatever the store's reply.
            metrics::held(grant.series(self.kind), grant.granted, now);
        }
        if watched {
            st.watched = st.watched.saturating_sub(1);
            if st.watched == 0 {
                st.next_renewal = None;
            }
        }
        if let Some(loss) = st.lost {
            return if st.holds == 0 {
                Plan::LastLost(loss)
            } else {
                Plan::Lost(loss)
            };
        }
        if st.holds > 0 {
            return Plan::StillHeld(st.holds);
        }
        st.ended = true;
        st.next_renewal = None;
        drop(st);
        Self::remove_if_same(&mut maps, grant);
        if remote {
            maps.releasing
                .entry(ByKey(grant.keys.clone()))
                .or_insert((0, None))
                .0 += 1;
        }
        Plan::Last
    }

    /// A release started by [`release`](Self::release) with `remote` is over.
    pub(crate) fn released(&self, keys: &Arc<LockKeys>) {
        let mut maps = self.maps();
        if let Entry::Occupied(mut e) = maps.releasing.entry(ByKey(keys.clone())) {
            e.get_mut().0 -= 1;
            if e.get().0 == 0
                && let (_, (_, Some(notify))) = e.remove_entry()
            {
                notify.notify_waiters();
            }
        }
    }

    /// Marks `grant` lost (once): detaches it and fires its lost signal. Returns true
    /// if this call marked it.
    pub(crate) fn lose(&self, grant: &Arc<Grant<B>>, loss: Loss) -> bool {
        let mut maps = self.maps();
        let mut st = grant.state();
        if st.lost.is_some() {
            return false;
        }
        st.lost = Some(loss);
        st.next_renewal = None;
        let was_held = !st.ended;
        st.ended = true;
        drop(st);
        if was_held {
            Self::remove_if_same(&mut maps, grant);
        }
        drop(maps);
        grant.lost_wake.notify_waiters();
        metrics::lost(grant.series(self.kind));
        true
    }

    /// Grants held and acquisitions in flight. A grant whose fixed lease ran out is not
    /// counted: nothing watches such a grant's end (see `Core::schedule`), so its slot
    /// goes only when the scope acquires or releases the name again.
    pub(crate) fn len(&self) -> usize {
        self.count(|_| true)
    }

    /// Grants held now (one per name and scope, however many holds each has).
    pub(crate) fn held(&self) -> usize {
        self.count(|s| matches!(s, Slot::Held(_)))
    }

    fn count(&self, which: impl Fn(&Slot<B>) -> bool) -> usize {
        let maps = self.maps();
        maps.slots
            .values()
            .filter(|s| which(s))
            .filter(|s| !matches!(s, Slot::Held(g) if g.overdue(&g.state())))
            .count()
    }

    fn remove_if_same(maps: &mut Maps<B>, grant: &Arc<Grant<B>>) {
        let slot_key = SlotKey::new(&grant.keys, grant.scope);
        if let Entry::Occupied(e) = maps.slots.entry(slot_key)
            && matches!(e.get(), Slot::Held(g) if Arc::ptr_eq(g, grant))
        {
            e.remove();
        }
    }
}

/// An acquisition in flight. Dropped without [`fulfil`](Self::fulfil) (busy, error,
/// cancelled), it unregisters and wakes the same scope's waiting acquisitions.
pub(crate) struct Ticket<'a, B: Seam> {
    registry: &'a Registry<B>,
    slot_key: Option<SlotKey>,
}

impl<B: Seam> Ticket<'_, B> {
    /// The acquisition was granted: `grant` is what the scope holds now.
    pub(crate) fn fulfil(mut self, grant: Arc<Grant<B>>) {
        let Some(slot_key) = self.slot_key.take() else {
            return;
        };
        let mut maps = self.registry.maps();
        if let Some(Slot::Acquiring(Some(notify))) = maps.slots.insert(slot_key, Slot::Held(grant))
        {
            notify.notify_waiters();
        }
    }
}

impl<B: Seam> Drop for Ticket<'_, B> {
    fn drop(&mut self) {
        let Some(slot_key) = self.slot_key.take() else {
            return;
        };
        let mut maps = self.registry.maps();
        if matches!(maps.slots.get(&slot_key), Some(Slot::Acquiring(_)))
            && let Some(Slot::Acquiring(Some(notify))) = maps.slots.remove(&slot_key)
        {
            notify.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backends::RedisBackend;
    use crate::client::store::key::lock_keys;

    type Registry = super::Registry<RedisBackend>;

    fn grant(reg: &Registry, scope: u64) -> Arc<Grant<RedisBackend>> {
        grant_until(reg, scope, Instant::now() + Duration::from_secs(30))
    }

    fn grant_until(reg: &Registry, scope: u64, until: Instant) -> Arc<Grant<RedisBackend>> {
        let keys = Arc::new(lock_keys("t", ":", "x").unwrap());
        let Enter::Acquire(ticket) = reg.enter(&keys, scope, false) else {
            panic!("expected a fresh acquisition");
        };
        let taken = Granted {
            grant: format!("c:{scope}:1").into(),
            seq: 1,
            token: Some(FencingToken::new(1, 1)),
            valid: Validity::Until(until),
            arrived: Instant::now(),
        };
        let g = Arc::new(Grant::new(keys, scope, Primitive::Lock, taken));
        ticket.fulfil(g.clone());
        g
    }

    #[test]
    fn reentry_counts_locally_and_the_last_hold_releases() {
        let reg = Registry::new(StoreKind::Redis);
        let g = grant(&reg, 1);
        let Enter::Reentered(same) = reg.enter(&g.keys, 1, false) else {
            panic!("same scope must re-enter");
        };
        assert!(Arc::ptr_eq(&same, &g));
        assert!(matches!(reg.enter(&g.keys, 2, false), Enter::Acquire(_)));
        assert!(matches!(reg.release(&g, false, true), Plan::StillHeld(1)));
        assert!(matches!(reg.release(&g, false, true), Plan::Last));
        // The release is in flight: the same scope waits for it, not for Redis.
        assert!(matches!(
            reg.enter(&g.keys, 1, false),
            Enter::Wait {
                own_release: true,
                ..
            }
        ));
        reg.released(&g.keys);
        assert!(matches!(reg.enter(&g.keys, 1, false), Enter::Acquire(_)));
        assert_eq!(reg.len(), 0, "dropped tickets unregister");
    }

    #[test]
    fn a_concurrent_acquisition_of_the_same_scope_waits() {
        let reg = Registry::new(StoreKind::Redis);
        let keys = Arc::new(lock_keys("t", ":", "y").unwrap());
        let first = reg.enter(&keys, 7, false);
        assert!(matches!(first, Enter::Acquire(_)));
        assert!(matches!(
            reg.enter(&keys, 7, false),
            Enter::Wait {
                own_release: false,
                ..
            }
        ));
        drop(first);
        assert!(matches!(reg.enter(&keys, 7, false), Enter::Acquire(_)));
    }

    #[test]
    fn a_lost_grant_is_detached_and_reports_its_loss() {
        let reg = Registry::new(StoreKind::Redis);
        let g = grant(&reg, 1);
        assert!(matches!(reg.enter(&g.keys, 1, false), Enter::Reentered(_)));
        assert!(reg.lose(&g, Loss::TakenOver));
        assert!(!reg.lose(&g, Loss::Expired), "fires once");
        assert!(g.is_lost());
        assert!(matches!(
            reg.release(&g, false, true),
            Plan::Lost(Loss::TakenOver)
        ));
        assert!(matches!(
            reg.release(&g, false, true),
            Plan::LastLost(Loss::TakenOver)
        ));
        // A new acquisition in the scope starts a fresh grant.
        assert!(matches!(reg.enter(&g.keys, 1, false), Enter::Acquire(_)));
    }

    #[test]
    fn an_overdue_grant_is_lost_when_touched_even_if_nobody_noticed() {
        let reg = Registry::new(StoreKind::Redis);
        let g = grant_until(&reg, 1, Instant::now());
        assert!(!g.is_lost(), "nobody noticed yet");
        // Re-entering it would hand out a hold on a lease nobody can prove.
        assert!(matches!(reg.enter(&g.keys, 1, false), Enter::Acquire(_)));
        assert!(g.is_lost());
        let h = grant_until(&reg, 2, Instant::now());
        assert!(matches!(
            reg.release(&h, false, true),
            Plan::LastLost(Loss::Expired)
        ));
        assert!(h.is_lost());
        // A kept grant has no local lease to run out.
        let keys = Arc::new(lock_keys("t", ":", "kept").unwrap());
        let Enter::Acquire(ticket) = reg.enter(&keys, 3, false) else {
            panic!("expected a fresh acquisition");
        };
        let taken = Granted {
            grant: "c:3:1".into(),
            seq: 2,
            token: None,
            valid: Validity::Kept,
            arrived: Instant::now(),
        };
        let kept = Arc::new(Grant::new(keys, 3, Primitive::Lock, taken));
        ticket.fulfil(kept.clone());
        assert!(matches!(
            reg.enter(&kept.keys, 3, false),
            Enter::Reentered(_)
        ));
        assert!(!kept.is_lost());
    }
}
