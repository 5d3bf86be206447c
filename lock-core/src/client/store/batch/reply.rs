//! Where a queued call's reply meets its caller: [`Pending`] on the caller's side,
//! [`ReplyTo`] on its driver's. What the call leaves to undo if its caller goes away
//! first is given with the wait ([`Pending::or_undo`]), and boxed only when the caller
//! does go away, so a call whose caller stays for its reply costs nothing for it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use redis::Value;

use super::super::deadline::{Elapsed, Place};
use crate::error::LockError;

/// What a call whose caller went away leaves to undo, run once its outcome is known:
/// with its reply or error if it was sent, with `None` if it never was.
pub(crate) type Cleanup = Box<dyn FnOnce(Option<Result<Value, LockError>>) + Send + Sync>;

/// A queued call's reply, or its caller's cleanup.
struct Slot(Mutex<State>);

enum State {
    /// The caller waits (woken by this waker, once it has polled).
    Waiting(Option<Waker>),
    /// The outcome is in; `sent`: whether the call went to Redis (so it may have run).
    Ready {
        reply: Result<Value, LockError>,
        sent: bool,
    },
    /// The caller went away first, leaving this to undo.
    Gone(Option<Cleanup>),
    /// The outcome was taken, by the caller or by its cleanup.
    Done,
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Each change under the lock is one assignment: nothing is left half-changed.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The most slots a connection keeps for reuse: a wave of queued calls.
const KEPT_SLOTS: usize = 2 * super::MAX_BATCH;

/// A connection's slots whose calls are over, for its next calls. A wave of queued
/// calls takes a slot each and frees them all as their callers take their replies:
/// allocated each time, they would cost an allocation and a free per call (two per
/// lock cycle), and a wave overflows the allocator's per-thread cache of one size.
#[derive(Default)]
pub(super) struct Slots(Mutex<Vec<Arc<Slot>>>);

impl Slots {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Slot>>> {
        // Only pushes and pops happen under it.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new call's two ends, in a kept slot if there is one.
    pub(super) fn slot<'c>(&'c self, op: &'static str, place: Place<'c>) -> (ReplyTo, Pending<'c>) {
        let slot = self
            .lock()
            .pop()
            .unwrap_or_else(|| Arc::new(Slot(Mutex::new(State::Waiting(None)))));
        (
            ReplyTo(Some(slot.clone())),
            Pending {
                slot,
                slots: self,
                op,
                place,
                done: false,
            },
        )
    }

    /// Keeps `slot` (nothing else holds it; waiting again) if there is room.
    fn give_back(&self, slot: Arc<Slot>) {
        let mut kept = self.lock();
        if kept.len() < KEPT_SLOTS {
            kept.push(slot);
        }
    }
}

/// The driver's end of a queued call. Dropped without delivering (its lane went away
/// before sending it), its caller gets an error and its cleanup learns nothing was sent.
pub(super) struct ReplyTo(Option<Arc<Slot>>);

impl ReplyTo {
    /// Whether the caller went away: the call can be left out.
    #[cfg(test)]
    fn is_gone(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|s| matches!(*s.lock(), State::Gone(_) | State::Done))
    }

    /// If the caller went away, leaves the call out unsent (what the caller left to
    /// undo learns nothing was sent) and answers true.
    pub(super) fn leave_out_if_gone(&mut self) -> bool {
        let Some(slot) = &self.0 else {
            return true;
        };
        let mut state = slot.lock();
        let State::Gone(cleanup) = &mut *state else {
            return matches!(*state, State::Done);
        };
        let cleanup = cleanup.take();
        *state = State::Done;
        drop(state);
        self.0 = None;
        if let Some(cleanup) = cleanup {
            cleanup(None);
        }
        true
    }

    /// Hands the caller the outcome of its call (`sent`: whether it went to Redis); a
    /// caller that went away leaves it to its cleanup.
    pub(super) fn deliver(&mut self, reply: Result<Value, LockError>, sent: bool) {
        let Some(slot) = self.0.take() else {
            return;
        };
        let mut state = slot.lock();
        // Matched in place: a state is large to move, and most are waiting.
        match &mut *state {
            State::Waiting(waker) => {
                let waker = waker.take();
                *state = State::Ready { reply, sent };
                drop(state);
                if let Some(w) = waker {
                    w.wake();
                }
            }
            State::Gone(cleanup) => {
                let cleanup = cleanup.take();
                *state = State::Done;
                drop(state);
                if let Some(cleanup) = cleanup {
                    cleanup(sent.then_some(reply));
                }
            }
            // Delivered once only: the slot was taken out above.
            State::Ready { .. } | State::Done => {}
        }
    }
}

impl Drop for ReplyTo {
    fn drop(&mut self) {
        if self.0.is_some() {
            self.deliver(Err(dropped()), false);
        }
    }
}

fn dropped() -> LockError {
    LockError::UnexpectedReply(
        "the batch carrying this call was dropped (its runtime shut down)".into(),
    )
}

/// The reply of a queued call, within twice the command timeout: one call ahead of it
/// ends (or a place was free), then its own. Dropped first, its call is left out if not
/// sent yet.
pub(crate) struct Pending<'c> {
    slot: Arc<Slot>,
    /// Where the slot goes back once its outcome is taken.
    slots: &'c Slots,
    op: &'static str,
    place: Place<'c>,
    /// The caller took its outcome, or left (dropped, or timed out): its end is done.
    done: bool,
}

/// What a poll of a [`Pending`] found.
enum Got {
    Reply(Result<Value, LockError>, bool),
    TimedOut(LockError),
}

impl<'c> Pending<'c> {
    /// The same wait, leaving what `make` makes to undo if the caller goes away before
    /// the outcome is known (the future dropped, or its time limit passed): run with its
    /// reply or error once known, or with `None` if the call is never sent. Made only
    /// then. A batch's error, which the caller does get, also runs it, with a copy.
    pub(crate) fn or_undo<C>(
        self,
        make: impl FnOnce() -> C,
    ) -> Undoing<'c, impl FnOnce() -> Cleanup>
    where
        C: FnOnce(Option<Result<Value, LockError>>) + Send + Sync + 'static,
    {
        Undoing {
            pending: self,
            make: Some(move || Box::new(make()) as Cleanup),
        }
    }

    fn poll_got(&mut self, cx: &mut Context<'_>) -> Poll<Got> {
        if !self.done {
            let mut state = self.slot.lock();
            match &mut *state {
                State::Waiting(waker) => {
                    if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                        *waker = Some(cx.waker().clone());
                    }
                }
                State::Ready { .. } => {
                    if let State::Ready { reply, sent } =
                        std::mem::replace(&mut *state, State::Done)
                    {
                        drop(state);
                        self.done = true;
                        self.place.leave();
                        return Poll::Ready(Got::Reply(reply, sent));
                    }
                }
                State::Gone(_) | State::Done => {}
            }
        }
        self.place
            .poll_elapsed(cx.waker())
            .map(|Elapsed(after)| Got::TimedOut(LockError::RedisTimeout { op: self.op, after }))
    }

    /// The caller goes away, leaving `cleanup` to undo: run now if the outcome is in,
    /// else kept for it.
    fn leave(&mut self, cleanup: Option<Cleanup>) {
        if self.done {
            return;
        }
        self.done = true;
        let mut state = self.slot.lock();
        match &mut *state {
            State::Waiting(_) => *state = State::Gone(cleanup),
            State::Ready { .. } => {
                if let State::Ready { reply, sent } = std::mem::replace(&mut *state, State::Done) {
                    drop(state);
                    if let Some(cleanup) = cleanup {
                        cleanup(sent.then_some(reply));
                    }
                }
            }
            State::Gone(_) | State::Done => {}
        }
    }
}

impl Future for Pending<'_> {
    type Output = Result<Value, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_got(cx).map(|got| match got {
            Got::Reply(reply, _) => reply,
            Got::TimedOut(e) => Err(e),
        })
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.leave(None);
        // Reused only once nothing else holds it (the driver delivered, and let go)
        // and its outcome was taken: a caller that left first leaves its slot to the
        // driver, which may still deliver into it.
        if let Some(slot) = Arc::get_mut(&mut self.slot) {
            let state = slot.0.get_mut().unwrap_or_else(PoisonError::into_inner);
            if matches!(state, State::Done) {
                *state = State::Waiting(None);
                self.slots.give_back(self.slot.clone());
            }
        }
    }
}

/// A [`Pending`] that leaves something to undo if its caller goes away
/// ([`Pending::or_undo`]).
pub(crate) struct Undoing<'c, M: FnOnce() -> Cleanup> {
    pending: Pending<'c>,
    make: Option<M>,
}

// Nothing here is ever pinned in place: `make` is only moved out and called.
impl<M: FnOnce() -> Cleanup> Unpin for Undoing<'_, M> {}

impl<M: FnOnce() -> Cleanup> Future for Undoing<'_, M> {
    type Output = Result<Value, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let got = std::task::ready!(this.pending.poll_got(cx));
        let make = this.make.take();
        Poll::Ready(match got {
            Got::Reply(Ok(v), _) => Ok(v),
            Got::Reply(Err(e), sent) => {
                if let Some(make) = make {
                    make()(sent.then(|| Err(each(&e, this.pending.op))));
                }
                Err(e)
            }
            Got::TimedOut(e) => {
                // The call may still run: what it leaves is undone once its reply is in.
                this.pending.leave(make.map(|m| m()));
                Err(e)
            }
        })
    }
}

impl<M: FnOnce() -> Cleanup> Drop for Undoing<'_, M> {
    fn drop(&mut self) {
        if let Some(make) = self.make.take() {
            self.pending.leave(Some(make()));
        }
    }
}

/// The error a failed batch gives its entry `op`: the one it would have had alone.
pub(super) fn each(e: &LockError, op: &'static str) -> LockError {
    match e {
        LockError::RedisTimeout { after, .. } => LockError::RedisTimeout { op, after: *after },
        LockError::Redis(r) => LockError::Redis(r.clone()),
        other => LockError::UnexpectedReply(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::super::deadline::{Deadlines, Limit};
    use super::*;

    type Seen = Arc<Mutex<Vec<Option<Result<Value, LockError>>>>>;

    fn undo_into(seen: &Seen) -> impl FnOnce() -> Cleanup + use<> {
        let seen = seen.clone();
        move || Box::new(move |r| seen.lock().unwrap().push(r))
    }

    fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        Pin::new(f).poll(&mut Context::from_waker(Waker::noop()))
    }

    /// The caller stays, leaves before the outcome, or leaves after it without taking
    /// it; the driver answers, fails the batch, or leaves the call out unsent. The
    /// caller gets exactly the outcome if it stayed; otherwise its undo (if it left
    /// one) runs once, with the outcome if the call was sent and with `None` if not.
    #[tokio::test]
    async fn each_outcome_reaches_the_caller_or_its_undo_once() {
        let deadlines = Deadlines::new(Duration::from_secs(60));
        // Shared by every round: a slot is reused after whatever its last call saw.
        let slots = Slots::default();
        let mut rng = fastrand::Rng::with_seed(5);
        for round in 0..500 {
            let (mut to, pending) = slots.slot("test", deadlines.place(Limit::Queued));
            let seen = Seen::default();
            let with_undo = rng.bool();
            let mut caller: Box<dyn Future<Output = Result<Value, LockError>> + Unpin> =
                if with_undo {
                    Box::new(Undoing {
                        pending,
                        make: Some(undo_into(&seen)),
                    })
                } else {
                    Box::new(pending)
                };
            // 0: stays; 1: leaves before the outcome; 2: leaves after it, untaken.
            let leaves = rng.u8(..3);
            if rng.bool() {
                assert!(poll_once(&mut caller).is_pending());
            }
            if leaves == 1 {
                drop(std::mem::replace(
                    &mut caller,
                    Box::new(std::future::pending()),
                ));
            }
            assert_eq!(to.is_gone(), leaves == 1, "round {round}");
            let (sent, ok) = (rng.bool(), rng.bool());
            let outcome = |n| {
                if ok {
                    Ok(Value::Int(n))
                } else {
                    Err(LockError::UnexpectedReply(format!("failed {n}")))
                }
            };
            if !sent && rng.bool() {
                // A lane dropped unsent: its caller gets an error.
                drop(to);
            } else {
                to.deliver(outcome(round), sent);
            }
            let got = match leaves {
                0 => Some(poll_once(&mut caller)),
                _ => {
                    drop(caller);
                    None
                }
            };
            let seen = seen.lock().unwrap();
            match got {
                Some(Poll::Ready(reply)) => {
                    let reply_ok = reply.as_ref().ok().cloned();
                    if let Some(v) = reply_ok {
                        assert_eq!(v, Value::Int(round), "round {round}");
                        assert!(seen.is_empty(), "round {round}: undone after an answer");
                    } else if with_undo {
                        // An error the caller gets also runs its undo, once.
                        assert_eq!(seen.len(), 1, "round {round}");
                        assert_eq!(seen[0].is_some(), sent, "round {round}");
                    } else {
                        assert!(seen.is_empty());
                    }
                }
                Some(Poll::Pending) => panic!("round {round}: no outcome after delivery"),
                None if with_undo => {
                    assert_eq!(seen.len(), 1, "round {round}: {seen:?}");
                    match &seen[0] {
                        None => assert!(!sent, "round {round}"),
                        Some(r) => {
                            assert!(sent, "round {round}");
                            assert_eq!(r.is_ok(), ok, "round {round}");
                        }
                    }
                }
                None => assert!(seen.is_empty(), "round {round}"),
            }
        }
    }

    /// A slot is kept once its caller took the outcome and the driver let go, never
    /// while the driver may still deliver into it, and no more than a wave's worth.
    #[tokio::test]
    async fn a_slot_is_reused_only_once_both_ends_are_done() {
        let deadlines = Deadlines::new(Duration::from_secs(60));
        let slots = Slots::default();
        let kept = |slots: &Slots| slots.lock().len();
        // The caller took its reply: kept, and the next call gets it, waiting again.
        let (mut to, mut pending) = slots.slot("a", deadlines.place(Limit::Queued));
        assert!(poll_once(&mut pending).is_pending());
        to.deliver(Ok(Value::Int(1)), true);
        assert!(matches!(
            poll_once(&mut pending),
            Poll::Ready(Ok(Value::Int(1)))
        ));
        drop(pending);
        assert_eq!(kept(&slots), 1);
        let (mut to, mut pending) = slots.slot("b", deadlines.place(Limit::Queued));
        assert_eq!(kept(&slots), 0);
        assert!(
            poll_once(&mut pending).is_pending(),
            "a reused slot kept an outcome"
        );
        to.deliver(Ok(Value::Int(2)), true);
        assert!(matches!(
            poll_once(&mut pending),
            Poll::Ready(Ok(Value::Int(2)))
        ));
        drop(pending);
        // The caller left first: the driver still holds the slot, which is not kept.
        let (mut to, pending) = slots.slot("c", deadlines.place(Limit::Queued));
        drop(pending);
        assert_eq!(kept(&slots), 0);
        to.deliver(Ok(Value::Int(3)), true);
        drop(to);
        assert_eq!(kept(&slots), 0);
        // A wave larger than what is kept.
        let calls: Vec<_> = (0..KEPT_SLOTS + 10)
            .map(|_| slots.slot("c", deadlines.place(Limit::Queued)))
            .collect();
        for (mut to, pending) in calls {
            to.deliver(Ok(Value::Okay), true);
            drop(to);
            assert!(matches!(pending.await, Ok(Value::Okay)));
        }
        assert_eq!(kept(&slots), KEPT_SLOTS);
    }

    /// A caller whose wait timed out hands its undo to the call, which runs it with the
    /// reply that comes after.
    #[tokio::test]
    async fn a_timed_out_caller_undoes_once_the_late_reply_is_in() {
        let deadlines = Deadlines::new(Duration::from_millis(20));
        let slots = Slots::default();
        let (mut to, pending) = slots.slot("late", deadlines.place(Limit::Queued));
        let seen = Seen::default();
        let undoing = Undoing {
            pending,
            make: Some(undo_into(&seen)),
        };
        let Err(LockError::RedisTimeout { op: "late", .. }) = undoing.await else {
            panic!("the wait did not time out")
        };
        assert!(seen.lock().unwrap().is_empty(), "undone before the reply");
        assert!(to.is_gone());
        to.deliver(Ok(Value::Okay), true);
        let seen = seen.lock().unwrap();
        assert!(matches!(seen[..], [Some(Ok(Value::Okay))]), "{seen:?}");
    }
}
