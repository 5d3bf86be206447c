//! Locks in this process's memory: a table of held names behind the engine's seam.
//!
//! Leases follow tokio's clock, so a paused test runtime can jump past them. A
//! watched grant needs no renewal in one process: the table keeps it until it is
//! given back (or until its max-hold, taken as its lease), and the engine reports the
//! watchdog lease as its validity.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::config::LockConfig;
use crate::client::store::key::LockKeys;
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
    /// Entries left after the last sweep of expired ones.
    after_sweep: usize,
}

#[derive(Debug)]
struct Entry {
    grant: u64,
    /// `None`: held until given back.
    until: Option<Instant>,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        self.until.is_none_or(|u| u > now)
    }
}

impl Table {
    fn insert(&mut self, key: &str, entry: Entry, now: Instant) {
        self.locks.insert(key.to_owned(), entry);
        // Expired entries nobody took again go in sweeps, so memory stays within
        // twice what is held.
        if self.locks.len() > 2 * self.after_sweep + 64 {
            self.locks.retain(|_, e| e.live(now));
            self.after_sweep = self.locks.len();
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
        self.table().locks.len()
    }

    /// Removes `key` if grant `grant` holds it, and wakes the waiters.
    fn remove(&self, key: &str, grant: u64) -> Held {
        let now = Instant::now();
        let mut table = self.table();
        let outcome = table.own(key, grant, now).map(drop);
        // Ours, live or not: gone now.
        if table.locks.get(key).is_some_and(|e| e.grant == grant) {
            table.locks.remove(key);
        }
        drop(table);
        self.released.notify_waiters();
        outcome
    }

    /// Lengthens grant `grant`'s lease to `lease` from now (a kept grant stays kept).
    fn lengthen(&self, key: &str, grant: u64, lease: Duration) -> Held<Instant> {
        let now = Instant::now();
        let until = now + lease;
        let mut table = self.table();
        let entry = table.own(key, grant, now)?;
        if let Some(u) = entry.until.as_mut() {
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

    const CAPABILITIES: Capabilities = Capabilities::LOCAL_LEASES;

    async fn take(
        &self,
        req: &Request,
        _seq: u64,
        _wait: Duration,
    ) -> Result<Taken<u64>, LockError> {
        // A watched grant is kept until given back, or ends at its max-hold.
        let lease = if req.watchdog {
            req.max_hold
        } else {
            Some(req.lease)
        };
        let now = Instant::now();
        let mut table = self.table();
        if let Some(e) = table.locks.get(&req.keys.key)
            && e.live(now)
        {
            let retry_after = e.until.map_or(self.config.watchdog_lease(), |u| u - now);
            return Ok(Taken::Busy {
                retry_after,
                failure: None,
            });
        }
        let grant = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
        let until = lease.and_then(|l| now.checked_add(l));
        table.insert(&req.keys.key, Entry { grant, until }, now);
        Ok(Taken::Granted {
            grant,
            token: Some(FencingToken::new(grant, grant)),
            valid: until.map_or(Validity::Kept, Validity::Until),
        })
    }

    async fn give_back(&self, keys: &LockKeys, grant: &u64) -> Result<Held, LockError> {
        Ok(self.remove(&keys.key, *grant))
    }

    fn give_back_now(&self, keys: &LockKeys, grant: &u64) -> Option<Held> {
        Some(self.remove(&keys.key, *grant))
    }

    fn let_expire(&self, keys: &LockKeys, grant: &u64) {
        // A kept grant keeps the watchdog lease from now, as on Redis.
        let now = Instant::now();
        let mut table = self.table();
        if let Ok(e) = table.own(&keys.key, *grant, now)
            && e.until.is_none()
        {
            e.until = now.checked_add(self.config.watchdog_lease());
        }
    }

    async fn extend(
        &self,
        keys: &LockKeys,
        grant: &u64,
        lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        Ok(self.lengthen(&keys.key, *grant, lease))
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, _channel: &'a str) -> Option<Listen<'a>> {
        Some(Listen::Local(self.released.clone()))
    }
}
