//! Read-write locks in memory: a lock's holders (readers, or one writer and its own
//! scope's readers) and the mark of a waiting writer that holds new readers back.

use std::time::Duration;

use tokio::time::Instant;

use super::Entry;
use crate::lock::registry::Loss;
use crate::lock::seam::Held;

/// One read-write lock: its holders (readers, or one writer and its own scope's
/// readers), and until when a waiting writer holds new readers back.
#[derive(Debug, Default)]
pub(super) struct Shared {
    holders: Vec<Holder>,
    writer_waits: Option<Instant>,
}

/// One hold of a read-write lock: a grant as a plain lock's entry records it, of
/// `scope`, reading or writing.
#[derive(Debug)]
struct Holder {
    entry: Entry,
    scope: u64,
    write: bool,
}

impl Shared {
    /// Whether anything in it still matters at `now`.
    pub(super) fn live(&self, now: Instant) -> bool {
        self.holders.iter().any(|h| h.entry.live(now)) || self.writer_waits.is_some_and(|w| w > now)
    }

    /// How long until the holders `blocking` may be gone (a kept one: `kept`).
    fn retry_after<'a>(
        blocking: impl Iterator<Item = &'a Holder>,
        now: Instant,
        kept: Duration,
    ) -> Duration {
        blocking
            .map(|h| h.entry.until.map_or(kept, |u| u - now))
            .min()
            .unwrap_or(kept)
    }

    /// One attempt to take a `write` (else read) hold of `scope` as `entry` (its grant
    /// and lease); `linger`: how long a busy writer that waits holds new readers back
    /// (`None`: it does not wait). `Err`: busy, for at most this long.
    pub(super) fn take(
        &mut self,
        (scope, write): (u64, bool),
        entry: Entry,
        now: Instant,
        (kept, linger): (Duration, Option<Duration>),
    ) -> Result<(), Duration> {
        self.holders.retain(|h| h.entry.live(now));
        if write {
            if !self.holders.is_empty() {
                let mut wait = Self::retry_after(self.holders.iter(), now, kept);
                if let Some(linger) = linger {
                    // Asked again before the mark runs out, so it stays marked.
                    // Another waiting writer's longer mark stands.
                    self.writer_waits = self.writer_waits.max(Some(now + linger));
                    wait = wait.min(linger / 2);
                }
                return Err(wait);
            }
            self.writer_waits = None;
        } else {
            let writer = |h: &&Holder| h.write;
            if let Some(w) = self.holders.iter().find(writer) {
                // Only the writer's own scope reads beside it (a downgrade).
                if w.scope != scope {
                    return Err(Self::retry_after(
                        self.holders.iter().filter(writer),
                        now,
                        kept,
                    ));
                }
            } else if let Some(waits) = self.writer_waits.filter(|w| *w > now) {
                return Err(waits - now);
            }
        }
        self.holders.push(Holder {
            entry,
            scope,
            write,
        });
        Ok(())
    }

    /// The entry of the hold `grant` if it is live; else how it was lost.
    pub(super) fn own(&mut self, grant: u64, now: Instant) -> Held<&mut Entry> {
        match self.holders.iter_mut().find(|h| h.entry.grant == grant) {
            Some(h) if h.entry.live(now) => Ok(&mut h.entry),
            _ => Err(Loss::Expired),
        }
    }

    /// Removes the hold `grant`, live or not: `Ok` if it was live, else how it was lost.
    pub(super) fn remove(&mut self, grant: u64, now: Instant) -> Held {
        let outcome = self.own(grant, now).map(drop);
        self.holders.retain(|h| h.entry.grant != grant);
        outcome
    }
}
