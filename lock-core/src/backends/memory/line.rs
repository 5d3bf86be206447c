//! The line of a fair lock in memory: its waiters, oldest first, each place kept by a
//! deadline that each attempt of its waiter pushes back.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The waiters of one fair lock: scope, and when its place lapses.
#[derive(Debug, Default)]
pub(super) struct Line(VecDeque<(u64, Instant)>);

impl Line {
    /// One attempt of waiter `scope` at a lock that is free unless `held` says how long
    /// it stays held: `Ok` if it may take the lock now (nobody stands before it; it
    /// leaves the line), else how long until it should ask again. `place`: how long its
    /// place lasts from now (`None`: it does not wait, and takes no place).
    pub(super) fn attempt(
        &mut self,
        scope: u64,
        place: Option<Duration>,
        held: Option<Duration>,
        now: Instant,
    ) -> Result<(), Duration> {
        self.0.retain(|w| w.1 > now);
        let answer = match (held, self.0.front().copied()) {
            (Some(held), _) => Err(held),
            (None, None) => Ok(()),
            (None, Some((first, _))) if first == scope => {
                self.0.pop_front();
                Ok(())
            }
            (None, Some((_, lapses))) => Err(lapses - now),
        };
        if answer.is_err()
            && let Some(place) = place
        {
            match self.0.iter_mut().find(|w| w.0 == scope) {
                Some(w) => w.1 = now + place,
                None => self.0.push_back((scope, now + place)),
            }
        }
        answer
    }

    /// Takes waiter `scope` out of the line: whether it stood first.
    pub(super) fn leave(&mut self, scope: u64) -> bool {
        let was_first = self.0.front().is_some_and(|w| w.0 == scope);
        self.0.retain(|w| w.0 != scope);
        was_first
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a place in it is still kept at `now`.
    pub(super) fn live(&self, now: Instant) -> bool {
        self.0.iter().any(|w| w.1 > now)
    }
}
