//! Locks in this process's memory: a table of held names behind the engine's seam.
//!
//! Leases follow tokio's clock, so a paused test runtime can jump past them. A
//! watched grant needs no renewal in one process: the table keeps it until it is
//! given back (or until its max-hold, taken as its lease), and the engine reports the
//! watchdog lease as its validity. Read-write locks are in `shared.rs`, the line of a
//! fair lock in `line.rs`.

mod line;
mod shared;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use self::line::Line;
use self::shared::Shared;
use crate::client::config::LockConfig;
use crate::client::store::key::{LockKeys, LockMode};
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::lock::Request;
use crate::lock::registry::Loss;
use crate::lock::seam::{Backend, Capabilities, Held, Seam, Taken, Validity};
use crate::metrics::StoreKind;
use crate::owner::FencingToken;

/// The store of [`MemoryLocks`](crate::MemoryLocks), whose guards are
/// [`MemoryGuard`](crate::MemoryGuard) (`LockGuard<MemoryBackend>`).
#[derive(Debug)]
pub struct MemoryBackend {
    config: LockConfig,
    table: Mutex<Table>,
    /// Fired by every give-back: waiters try again.
    released: Arc<Notify>,
    /// The last grant number (and fencing token) handed out.
    tokens: AtomicU64,
}

impl Backend for MemoryBackend {}

#[derive(Debug, Default)]
struct Table {
    locks: HashMap<String, Entry>,
    /// Read-write locks, by key.
    shared: HashMap<String, Shared>,
    /// The waiters of fair locks, by key.
    lines: HashMap<String, Line>,
    /// Entries left after the last sweep of expired ones.
    after_sweep: usize,
}

#[derive(Debug)]
struct Entry {
    grant: u64,
    /// `None`: held until given back.
    until: Option<Instant>,
    /// Kept while held, as the watchdog keeps it on Redis: `until` is only its
    /// max-hold cap, not a lease that a lock left to expire waits out.
    watched: bool,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| u > now)
    }
}

impl Table {
    fn insert(&mut self, key: &str, entry: Entry, now: Instant) {
        self.locks.insert(key.to_owned(), entry);
        self.sweep(now);
    }

    /// Expired entries nobody took again go in sweeps, so memory stays within twice
    /// what is held.
    fn sweep(&mut self, now: Instant) {
        let len = self.locks.len() + self.shared.len() + self.lines.len();
        // Entries given back since the last sweep lower the bound with them: it follows
        // what is held, not the most that ever was.
        self.after_sweep = self.after_sweep.min(len);
        if len > 2 * self.after_sweep + 64 {
            self.locks.retain(|_, e| e.live(now));
            self.shared.retain(|_, e| e.live(now));
            self.lines.retain(|_, line| line.live(now));
            self.after_sweep = self.locks.len() + self.shared.len() + self.lines.len();
        }
    }

    /// The read-write lock `key`, made if absent.
    fn shared(&mut self, key: &str, now: Instant) -> &mut Shared {
        if !self.shared.contains_key(key) {
            self.sweep(now);
        }
        self.shared.entry(key.to_owned()).or_default()
    }

    /// One attempt of fair waiter `scope` at `key` (see [`Line::attempt`]); a line is
    /// made only for a waiter that finds the lock held, and goes once empty.
    fn fair_turn(
        &mut self,
        key: &str,
        (scope, place): (u64, Option<Duration>),
        held: Option<Duration>,
        now: Instant,
    ) -> Result<(), Duration> {
        if !self.lines.contains_key(key) {
            if held.is_none() || place.is_none() {
                return held.map_or(Ok(()), Err);
            }
            self.sweep(now);
        }
        let line = self.lines.entry(key.to_owned()).or_default();
        let answer = line.attempt(scope, place, held, now);
        if line.is_empty() {
            self.lines.remove(key);
        }
        answer
    }

    /// The entry of `keys`' live grant `grant`, in whichever table its kind of hold
    /// lives; else how it was lost.
    fn entry(&mut self, keys: &LockKeys, grant: u64, now: Instant) -> Held<&mut Entry> {
        if keys.mode.is_read_write() {
            let shared = self.shared.get_mut(&keys.key).ok_or(Loss::Expired)?;
            shared.own(grant, now)
        } else {
            self.own(&keys.key, grant, now)
        }
    }

    /// The entry of `key` if it is grant `grant`'s and live; else how it was lost.
    fn own(&mut self, key: &str, grant: u64, now: Instant) -> Held<&mut Entry> {
        match self.locks.get_mut(key) {
            Some(e) if e.grant == grant && e.live(now) => Ok(e),
            Some(e) if e.grant != grant && e.live(now) => Err(Loss::TakenOver),
            _ => Err(Loss::Expired),
        }
    }
}

impl MemoryBackend {
    pub(crate) fn new(config: LockConfig) -> Self {
        Self {
            config,
            table: Mutex::new(Table::default()),
            released: Arc::new(Notify::new()),
            tokens: AtomicU64::new(0),
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries in the table: held locks, plus expired ones not swept yet.
    pub(crate) fn entries(&self) -> usize {
        let table = self.table();
        table.locks.len() + table.shared.len() + table.lines.len()
    }

    /// Waiters in the line of the fair lock `key`.
    pub(crate) fn in_line(&self, key: &str) -> usize {
        self.table().lines.get(key).map_or(0, Line::len)
    }

    /// Removes `keys`' grant `grant` if it holds the lock, and wakes the waiters.
    fn remove(&self, keys: &LockKeys, grant: u64) -> Held {
        let (key, now) = (keys.key.as_str(), Instant::now());
        let mut table = self.table();
        let outcome = if keys.mode.is_read_write() {
            let Some(shared) = table.shared.get_mut(key) else {
                return Err(Loss::Expired);
            };
            let outcome = shared.remove(grant, now);
            if !shared.live(now) {
                table.shared.remove(key);
            }
            outcome
        } else {
            let outcome = table.own(key, grant, now).map(drop);
            // Ours, live or not: gone now.
            if table.locks.get(key).is_some_and(|e| e.grant == grant) {
                table.locks.remove(key);
            }
            outcome
        };
        drop(table);
        self.released.notify_waiters();
        outcome
    }

    /// Lengthens grant `grant`'s lease to `lease` from now (a kept grant stays kept).
    fn lengthen(&self, keys: &LockKeys, grant: u64, lease: Duration) -> Held<Instant> {
        let now = Instant::now();
        let until = now + lease;
        let mut table = self.table();
        if let Some(u) = table.entry(keys, grant, now)?.until.as_mut() {
            *u = (*u).max(until);
        }
        Ok(until)
    }
}

impl Seam for MemoryBackend {
    type Grant = u64;

    fn kind(&self) -> StoreKind {
        StoreKind::Memory
    }

    fn config(&self) -> &LockConfig {
        &self.config
    }

    const CAPABILITIES: Capabilities = Capabilities::LOCAL_LEASES.with_shared(true);

    async fn take(
        &self,
        req: &Request,
        _seq: u64,
        deadline: Instant,
    ) -> Result<Taken<u64>, LockError> {
        // A watched grant is kept until given back, or ends at its max-hold.
        let lease = if req.watchdog {
            req.max_hold
        } else {
            Some(req.lease)
        };
        let now = Instant::now();
        let wait = deadline.saturating_duration_since(now);
        let until = lease.and_then(|l| now.checked_add(l));
        let entry = |grant, until| Entry {
            grant,
            until,
            watched: req.watchdog,
        };
        let mut table = self.table();
        let turn = if req.keys.mode.is_read_write() {
            // Numbered before the attempt: the holders' table records it on a grant.
            let grant = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
            let write = req.keys.mode == LockMode::Write;
            // A waiting writer marks the lock for as long as it still waits, at most
            // one linger (it asks again within that).
            let linger = (!wait.is_zero()).then(|| wait.min(self.config.waiter_linger()));
            let kept = self.config.watchdog_lease();
            let who = (req.scope.id(), write);
            table
                .shared(&req.keys.key, now)
                .take(who, entry(grant, until), now, (kept, linger))
                .map(|()| grant)
        } else {
            let held = table
                .locks
                .get(&req.keys.key)
                .filter(|e| e.live(now))
                .map(|e| e.until.map_or(self.config.watchdog_lease(), |u| u - now));
            let turn = if req.fair {
                let place = (!wait.is_zero()).then(|| self.config.waiter_linger());
                let who = (req.scope.id(), place);
                table.fair_turn(&req.keys.key, who, held, now)
            } else {
                held.map_or(Ok(()), Err)
            };
            turn.map(|()| {
                let grant = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
                table.insert(&req.keys.key, entry(grant, until), now);
                grant
            })
        };
        Ok(match turn {
            Ok(grant) => Taken::Granted {
                grant,
                token: Some(FencingToken::new(grant, grant)),
                valid: until.map_or(Validity::Kept, Validity::Until),
            },
            Err(retry_after) => Taken::Busy {
                retry_after,
                failure: None,
            },
        })
    }

    async fn give_back(&self, keys: &LockKeys, grant: &u64) -> Result<Held, LockError> {
        Ok(self.remove(keys, *grant))
    }

    fn give_back_now(&self, keys: &LockKeys, grant: &u64) -> Option<Held> {
        Some(self.remove(keys, *grant))
    }

    fn let_expire(&self, keys: &LockKeys, grant: &u64) {
        // A watched grant keeps the watchdog lease from now, as on Redis, or less of
        // its cap.
        let now = Instant::now();
        let mut table = self.table();
        if let Ok(e) = table.entry(keys, *grant, now)
            && e.watched
        {
            let lease = now.checked_add(self.config.watchdog_lease());
            e.until = e.until.into_iter().chain(lease).min();
            e.watched = false;
        }
    }

    fn keep(&self, keys: &LockKeys, grant: &u64) -> Held {
        let now = Instant::now();
        let mut table = self.table();
        let e = table.entry(keys, *grant, now)?;
        e.until = None;
        e.watched = true;
        Ok(())
    }

    async fn extend(
        &self,
        keys: &LockKeys,
        grant: &u64,
        lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        Ok(self.lengthen(keys, *grant, lease))
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, _channel: &'a str) -> Option<Listen<'a>> {
        Some(Listen::Local(self.released.clone()))
    }

    async fn leave(&self, req: &Request) -> Result<(), LockError> {
        let mut table = self.table();
        let Some(line) = table.lines.get_mut(&req.keys.key) else {
            return Ok(());
        };
        let was_first = line.leave(req.scope.id());
        if line.is_empty() {
            table.lines.remove(&req.keys.key);
        }
        drop(table);
        if was_first {
            // The next in line may take a free lock now.
            self.released.notify_waiters();
        }
        Ok(())
    }
}
