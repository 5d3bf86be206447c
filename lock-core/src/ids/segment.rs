//! Segment mode: blocks of sequence numbers reserved with INCRBY, handed out locally.
//!
//! [`Segments`] is the pure bookkeeping (unit-tested without Redis); [`next_id`] drives it
//! with the clock, the mutex and the background reservations.
//!
//! Invariants:
//! - at most one reservation is in flight, so blocks arrive in the counter's order and
//!   every block's numbers are above all numbers handed out before (same day);
//! - the current block's unissued numbers plus the pending (or in-flight) block never
//!   exceed `block`: a prefetch started with `left` numbers still unissued asks for
//!   `block - left`. A crash wastes at most `block` numbers;
//! - a block belongs to one UTC day; blocks of an earlier day are dropped, never used.

use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::futures::Notified;

use super::{ClockStep, Gen, OrderId, clock_step, compose, day_key, exhausted, system_now};
use crate::client::cleanup;
use crate::client::store::scripts::RESERVE_IDS;
use crate::error::LockError;

/// Numbers `first..=last` of one day's counter; empty once `next > last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Block {
    day: u64,
    next: u64,
    last: u64,
}

impl Block {
    fn left(&self) -> u64 {
        (self.last + 1).saturating_sub(self.next)
    }
}

/// A reservation to make: `count` numbers of `day`'s counter, answered with `ticket`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Refill {
    pub(super) ticket: u64,
    pub(super) day: u64,
    pub(super) count: u32,
}

/// The outcome of [`Segments::take`].
#[derive(Debug, PartialEq)]
pub(super) enum Take {
    /// A sequence number; start `refill` in the background if given.
    Seq(u32, Option<Refill>),
    /// Nothing left: wait for reservation `ticket` (start `refill` first if given).
    Empty { ticket: u64, refill: Option<Refill> },
    /// The day's 32-bit sequence is used up.
    Exhausted,
}

#[derive(Debug)]
pub(super) struct Segments {
    block: u32,
    /// The UTC day of the latest take.
    day: u64,
    current: Option<Block>,
    pending: Option<Block>,
    in_flight: Option<u64>,
    tickets: u64,
    /// The latest failed reservation, for the callers that waited on it.
    failure: Option<(u64, LockError)>,
    exhausted_day: Option<u64>,
}

impl Segments {
    pub(super) fn new(block: u32) -> Self {
        Self {
            block,
            day: 0,
            current: None,
            pending: None,
            in_flight: None,
            tickets: 0,
            failure: None,
            exhausted_day: None,
        }
    }

    /// Prefetch once this few numbers (a fifth of a block) are left: 80% used.
    fn low_water(&self) -> u64 {
        u64::from(self.block / 5)
    }

    fn start(&mut self, day: u64, count: u64) -> Refill {
        self.tickets += 1;
        self.in_flight = Some(self.tickets);
        Refill {
            ticket: self.tickets,
            day,
            count: count as u32,
        }
    }

    /// The next number for an id of UTC day `day` (never below the day of an earlier
    /// call: the caller's clock gate sees to that).
    pub(super) fn take(&mut self, day: u64) -> Take {
        if day != self.day {
            self.day = day;
            self.current = self.current.filter(|b| b.day == day);
            self.pending = self.pending.filter(|b| b.day == day);
        }
        if self.current.is_none_or(|b| b.left() == 0) {
            self.current = self.pending.take();
        }
        if let Some(b) = self.current.as_mut().filter(|b| b.left() > 0) {
            let seq = b.next as u32;
            b.next += 1;
            let left = b.left();
            let refill = (left <= self.low_water()
                && self.pending.is_none()
                && self.in_flight.is_none()
                && self.exhausted_day != Some(day))
            .then(|| self.start(day, u64::from(self.block) - left));
            return Take::Seq(seq, refill);
        }
        if self.exhausted_day == Some(day) {
            return Take::Exhausted;
        }
        let refill = match self.in_flight {
            Some(_) => None,
            None => Some(self.start(day, u64::from(self.block))),
        };
        Take::Empty {
            ticket: self.in_flight.unwrap_or(self.tickets),
            refill,
        }
    }

    /// The answer to reservation `ticket` of `day`: `first..=last`, or the error.
    pub(super) fn install(&mut self, ticket: u64, day: u64, result: Result<(u64, u64), LockError>) {
        if self.in_flight == Some(ticket) {
            self.in_flight = None;
        }
        let (first, last) = match result {
            Err(e) => {
                self.failure = Some((ticket, e));
                return;
            }
            // Reserved before midnight, answered after: that day is over for us.
            Ok(_) if day != self.day => return,
            Ok(range) => range,
        };
        let last = last.min(u64::from(super::MAX_SEQUENCE));
        if first > last {
            self.exhausted_day = Some(day);
            return;
        }
        let block = Some(Block {
            day,
            next: first,
            last,
        });
        if self.current.is_none_or(|b| b.left() == 0) {
            self.current = block;
        } else {
            self.pending = block;
        }
    }

    /// The error of reservation `ticket` or a later one, if it failed.
    fn failed_since(&self, ticket: u64) -> Option<LockError> {
        match &self.failure {
            Some((t, e)) if *t >= ticket => Some(share(e)),
            _ => None,
        }
    }
}

/// A copy of a reservation's error for each caller that waited on it.
fn share(e: &LockError) -> LockError {
    match e {
        LockError::Redis(r) => LockError::Redis(r.clone()),
        LockError::RedisTimeout { op, after } => LockError::RedisTimeout { op, after: *after },
        LockError::UnexpectedReply(s) => LockError::UnexpectedReply(s.clone()),
        LockError::IdsUnavailable(s) => LockError::IdsUnavailable(s.clone()),
        other => LockError::IdsUnavailable(other.to_string()),
    }
}

/// What one look at the state decided.
enum Step {
    /// Issued; start the refill, if any, in the background.
    Issued(OrderId, Option<Refill>),
    /// The clock stepped back: sleep this long, then look again.
    Sleep(Duration),
    /// No number left: start the refill, if any, then wait for reservation `ticket`.
    Wait(u64, Option<Refill>),
}

/// Segment mode's `next_id`.
pub(super) async fn next_id(g: &Arc<Gen>) -> Result<OrderId, LockError> {
    // The fast path never waits: give the runtime a turn now and then (once the task's
    // coop budget is spent), so a background reservation runs even under a caller that
    // does nothing but take ids. Before the take, so a cancel here wastes nothing.
    tokio::task::coop::consume_budget().await;
    let mut waited = Duration::ZERO;
    let mut waiting_on: Option<u64> = None;
    loop {
        let mut refilled = pin!(g.refilled.notified());
        match step(g, waited, waiting_on, refilled.as_mut())? {
            Step::Issued(id, refill) => {
                if let Some(r) = refill {
                    spawn_refill(g, r);
                }
                return Ok(id);
            }
            Step::Sleep(d) => {
                tracing::debug!(ids = %g.name, behind = ?d, "system clock stepped back; waiting");
                tokio::time::sleep(d).await;
                waited += d;
            }
            Step::Wait(ticket, refill) => {
                waiting_on = Some(ticket);
                if let Some(r) = refill {
                    spawn_refill(g, r);
                }
                refilled.await;
            }
        }
    }
}

/// One look at the state, under the mutex (never held across an await).
fn step(
    g: &Gen,
    waited: Duration,
    waiting_on: Option<u64>,
    refilled: Pin<&mut Notified<'_>>,
) -> Result<Step, LockError> {
    let mut st = g.state();
    // The clock is read under the mutex, so readings are in hand-out order and a reading
    // below the last issued second means the clock really stepped back.
    let step = clock_step(
        system_now(),
        g.config.epoch,
        st.last_secs,
        waited,
        g.config.max_clock_wait,
    )?;
    let secs = match step {
        ClockStep::Go(secs) => secs,
        ClockStep::Wait(d) => return Ok(Step::Sleep(d)),
    };
    if let Some(e) = waiting_on.and_then(|t| st.segments.failed_since(t)) {
        return Err(e);
    }
    let day = g.day_of(secs);
    match st.segments.take(day) {
        Take::Seq(seq, refill) => {
            st.last_secs = secs;
            Ok(Step::Issued(compose(secs, seq), refill))
        }
        Take::Exhausted => Err(exhausted(&g.name, day)),
        Take::Empty { ticket, refill } => {
            // Registered while the mutex is held: the install (under the mutex) and its
            // wake-up come after.
            refilled.enable();
            Ok(Step::Wait(ticket, refill))
        }
    }
}

/// Reserves a block in a task of its own, so a cancelled caller cannot strand it: on
/// the background runtime, so neither can a caller's runtime that ends mid-call (its
/// callers would otherwise wait for this reservation forever).
fn spawn_refill(g: &Arc<Gen>, r: Refill) {
    let g = g.clone();
    drop(cleanup::spawn_lasting(async move {
        let result = reserve(&g, r).await;
        if let Err(e) = &result {
            tracing::debug!(ids = %g.name, error = %e, "reserving a block of ids failed");
        }
        g.state().segments.install(r.ticket, r.day, result);
        g.refilled.notify_waiters();
    }));
}

async fn reserve(g: &Gen, r: Refill) -> Result<(u64, u64), LockError> {
    let key = day_key(&g.base, r.day);
    let reply: Vec<i64> = g
        .client
        .conn()
        .invoke("reserve_ids", &RESERVE_IDS, |c| {
            c.arg(1)
                .arg(&key)
                .arg(r.count)
                .arg(g.config.day_key_ttl.as_secs());
        })
        .await?;
    match reply[..] {
        [first, last] if first >= 1 && last - first + 1 == i64::from(r.count) => {
            Ok((first as u64, last as u64))
        }
        _ => Err(LockError::UnexpectedReply(format!(
            "reserve_ids.lua returned {reply:?} for a block of {}",
            r.count
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 19_800;

    /// Takes one number, expecting one.
    fn seq(s: &mut Segments, day: u64) -> (u32, Option<Refill>) {
        match s.take(day) {
            Take::Seq(n, r) => (n, r),
            other => panic!("expected a number, got {other:?}"),
        }
    }

    #[test]
    fn first_take_waits_for_a_full_block() {
        let mut s = Segments::new(10);
        let Take::Empty { ticket, refill } = s.take(DAY) else {
            panic!()
        };
        assert_eq!(
            refill,
            Some(Refill {
                ticket,
                day: DAY,
                count: 10
            })
        );
        // A second caller waits on the same reservation, starting none.
        assert_eq!(
            s.take(DAY),
            Take::Empty {
                ticket,
                refill: None
            }
        );
        s.install(ticket, DAY, Ok((1, 10)));
        assert_eq!(seq(&mut s, DAY), (1, None));
    }

    #[test]
    fn prefetch_at_80_percent_keeps_at_most_one_block_reserved() {
        let mut s = Segments::new(10);
        let Take::Empty { ticket, .. } = s.take(DAY) else {
            panic!()
        };
        s.install(ticket, DAY, Ok((1, 10)));
        for n in 1..=7 {
            assert_eq!(seq(&mut s, DAY), (n, None));
        }
        // 8 handed out, 2 left = a fifth: fetch the next one, sized 10 - 2.
        let (n, refill) = seq(&mut s, DAY);
        assert_eq!(n, 8);
        let r = refill.expect("prefetch");
        assert_eq!(r.count, 8);
        // No second prefetch while one is in flight.
        assert_eq!(seq(&mut s, DAY), (9, None));
        // Another process took 11..=30 meanwhile; ours is 31..=38.
        s.install(r.ticket, DAY, Ok((31, 38)));
        assert_eq!(s.current.unwrap().left() + s.pending.unwrap().left(), 9);
        // The boundary: straight from 10 to the pending block, no wait.
        assert_eq!(seq(&mut s, DAY), (10, None));
        assert_eq!(seq(&mut s, DAY), (31, None));
    }

    #[test]
    fn numbers_only_grow_within_a_day_across_many_blocks() {
        let mut s = Segments::new(7);
        let mut counter = 0u64;
        let mut last = 0u32;
        for _ in 0..1000 {
            match s.take(DAY) {
                Take::Seq(n, refill) => {
                    assert!(n > last, "{n} after {last}");
                    last = n;
                    if let Some(r) = refill {
                        counter += 3; // other processes
                        let first = counter + 1;
                        counter += u64::from(r.count);
                        s.install(r.ticket, r.day, Ok((first, counter)));
                    }
                }
                Take::Empty { ticket, refill } => {
                    let r = refill.expect("nothing in flight here");
                    let first = counter + 1;
                    counter += u64::from(r.count);
                    s.install(ticket, r.day, Ok((first, counter)));
                }
                Take::Exhausted => panic!(),
            }
            let held = s.current.map_or(0, |b| b.left()) + s.pending.map_or(0, |b| b.left());
            assert!(held <= 7, "holding {held} unissued numbers");
        }
    }

    #[test]
    fn a_new_day_drops_the_old_blocks() {
        let mut s = Segments::new(10);
        let Take::Empty { ticket, .. } = s.take(DAY) else {
            panic!()
        };
        s.install(ticket, DAY, Ok((1, 10)));
        let mut prefetch = None;
        for n in 1..=9 {
            let (got, r) = seq(&mut s, DAY);
            assert_eq!(got, n);
            prefetch = prefetch.or(r);
        }
        let prefetch = prefetch.expect("prefetch at 80%");
        // Midnight: the old block (one number left) is not used, and the old day's
        // reservation is still in flight, so the caller waits for it.
        assert_eq!(
            s.take(DAY + 1),
            Take::Empty {
                ticket: prefetch.ticket,
                refill: None
            }
        );
        // It comes back after midnight and is dropped; a new day's block is reserved.
        s.install(prefetch.ticket, DAY, Ok((11, 18)));
        let Take::Empty { ticket, refill } = s.take(DAY + 1) else {
            panic!()
        };
        let r = refill.expect("a reservation for the new day");
        assert_eq!((r.ticket, r.day, r.count), (ticket, DAY + 1, 10));
        s.install(ticket, DAY + 1, Ok((1, 10)));
        assert_eq!(seq(&mut s, DAY + 1), (1, None));
    }

    #[test]
    fn exhaustion_uses_the_last_numbers_then_refuses_the_day() {
        let max = u64::from(u32::MAX);
        let mut s = Segments::new(10);
        let Take::Empty { ticket, .. } = s.take(DAY) else {
            panic!()
        };
        // Only 3 numbers of this block fit in 32 bits.
        s.install(ticket, DAY, Ok((max - 2, max + 7)));
        let (n, refill) = seq(&mut s, DAY);
        assert_eq!(n, u32::MAX - 2);
        let r = refill.expect("prefetch: 2 left");
        // The reservation finds the day used up; the numbers already held still count.
        s.install(r.ticket, DAY, Ok((max + 8, max + 15)));
        assert_eq!(seq(&mut s, DAY), (u32::MAX - 1, None));
        assert_eq!(seq(&mut s, DAY), (u32::MAX, None));
        assert_eq!(s.take(DAY), Take::Exhausted);
        assert_eq!(s.take(DAY), Take::Exhausted);
        // The next day starts afresh.
        assert!(matches!(
            s.take(DAY + 1),
            Take::Empty {
                refill: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn a_failed_reservation_reaches_its_waiters_and_is_retried() {
        let mut s = Segments::new(10);
        let Take::Empty { ticket, .. } = s.take(DAY) else {
            panic!()
        };
        assert!(s.failed_since(ticket).is_none());
        let timeout = LockError::RedisTimeout {
            op: "reserve_ids",
            after: Duration::from_secs(2),
        };
        s.install(ticket, DAY, Err(timeout));
        assert!(s.failed_since(ticket).unwrap().is_timeout());
        // The next caller starts a new reservation, and an old failure is not its own.
        let Take::Empty { ticket: t2, refill } = s.take(DAY) else {
            panic!()
        };
        assert!(t2 > ticket && refill.is_some());
        assert!(s.failed_since(t2).is_none());
    }
}
