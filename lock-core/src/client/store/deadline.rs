//! Time limits on a connection's calls, without a timer per call.
//!
//! Every call of one kind on a connection has the same limit ([`Limit`]), so its calls
//! come due in the order they started: a line of deadlines in that order needs one
//! timer, for its front. A call joins the back of its line when it first waits (one
//! answered at once never joins) and leaves when it ends; ended calls are dropped from
//! the front. One keeper task per connection, on the process's background runtime,
//! sleeps until the earliest front comes due, drops the calls whose time is up from
//! the line and wakes them: a waiting call that is no longer in its line has timed out.
//!
//! A tokio timer per call costs a wheel entry, its insert and removal, and wheel work
//! on each park of the caller's runtime: a lock's cycle (two calls) cost 1,100 to 1,400
//! client instructions more with them. Here a call costs a clock read, a push and a pop
//! under an uncontended lock.
//!
//! The keeper sleeps at most the shortest limit past its last pass, so a call that
//! joins while it sleeps is never due before it wakes: joining wakes it only when it
//! parked. It parks when a pass finds the lines empty and nothing joined since the
//! pass before; while calls keep coming it wakes about once per limit. A call with a
//! shorter limit of its own ([`Deadlines::within_at_most`]), and every call without a
//! background runtime (the OS refused its thread), has a tokio timer instead.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tokio::sync::Notify;

/// Which limit a call has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Limit {
    /// The connection's command timeout: a call sent on the caller's future.
    Call,
    /// Twice the command timeout: a call queued behind a batch in flight (the batch
    /// ahead of it ends, then its own).
    Queued,
}

/// The time limits of one connection's calls; cheap to clone.
#[derive(Clone)]
pub(crate) struct Deadlines {
    shared: Arc<Shared>,
}

/// Time was up before the call ended.
#[derive(Debug)]
pub(crate) struct Elapsed(pub(crate) Duration);

struct Shared {
    /// Each [`Limit`]'s, in its order.
    after: [Duration; 2],
    state: Mutex<State>,
    /// Wakes a parked keeper; shared with it, so it can wait without keeping `Shared`.
    wake: Arc<Notify>,
}

struct State {
    /// One line per [`Limit`], in its order.
    lines: [Line; 2],
    keeper: Keeper,
    /// A call joined since the keeper's last pass.
    joined: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Keeper {
    /// Not started: no call has waited yet.
    Unborn,
    /// Sleeping until a time no joining call is due before.
    Sleeping,
    /// Waiting for a call to join.
    Parked,
    /// There is no background runtime: calls keep their own timers.
    Absent,
}

#[derive(Default)]
struct Line {
    /// The ticket of `slots[0]`; tickets count up from 0 in joining order.
    front: u64,
    slots: VecDeque<Slot>,
}

struct Slot {
    due: Instant,
    /// `None` once the call ended.
    waker: Option<Waker>,
}

impl Line {
    fn pop_ended(&mut self) {
        while self.slots.front().is_some_and(|s| s.waker.is_none()) {
            self.slots.pop_front();
            self.front += 1;
        }
    }
}

impl Deadlines {
    /// The limits of a connection whose command timeout is `after`.
    pub(crate) fn new(after: Duration) -> Self {
        let state = State {
            lines: Default::default(),
            keeper: Keeper::Unborn,
            joined: false,
        };
        Self {
            shared: Arc::new(Shared {
                after: [after, after * 2],
                state: Mutex::new(state),
                wake: Arc::new(Notify::new()),
            }),
        }
    }

    /// How long a call with `limit` may take.
    pub(crate) fn after(&self, limit: Limit) -> Duration {
        self.shared.after[limit as usize]
    }

    /// Runs `call` within `limit`: its output, or [`Elapsed`] if time was up first (the
    /// call is then dropped).
    pub(crate) fn within<F: Future>(&self, limit: Limit, call: F) -> Within<'_, F> {
        Within {
            call,
            place: self.place(limit),
        }
    }

    /// Runs `call` within `after` if that is shorter than [`Limit::Call`], on a timer
    /// of its own (out of order in the line), else within [`Limit::Call`].
    pub(crate) fn within_at_most<F: Future>(&self, after: Duration, call: F) -> Within<'_, F> {
        let mut place = self.place(Limit::Call);
        if after < self.after(Limit::Call) {
            place.at = At::timer(after);
        }
        Within { call, place }
    }

    /// A call's place in the line of `limit`, taken when it first waits.
    pub(crate) fn place(&self, limit: Limit) -> Place<'_> {
        Place {
            deadlines: self,
            limit,
            at: At::Out,
        }
    }
}

pin_project! {
    /// A call within its limit (see [`Deadlines::within`]).
    pub(crate) struct Within<'d, F> {
        #[pin]
        call: F,
        place: Place<'d>,
    }
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.call.poll(cx) {
            this.place.leave();
            return Poll::Ready(Ok(out));
        }
        this.place.poll_elapsed(cx.waker()).map(Err)
    }
}

/// A call's place in its line: joined on its first wait, left when dropped (or
/// [`leave`](Self::leave)). A caller polls it with [`poll_elapsed`](Self::poll_elapsed)
/// each time its call is not ready.
pub(crate) struct Place<'d> {
    deadlines: &'d Deadlines,
    limit: Limit,
    at: At,
}

enum At {
    /// Not in the line: not waited yet, or left.
    Out,
    Ticket(u64),
    /// Its own timer, of the given length: a shorter limit, or no keeper.
    Timer(Pin<Box<tokio::time::Sleep>>, Duration),
}

impl At {
    fn timer(after: Duration) -> Self {
        Self::Timer(Box::pin(tokio::time::sleep(after)), after)
    }
}

impl Place<'_> {
    /// Ready when time is up: the call must end now with [`Elapsed`]. Registers `waker`
    /// to be woken then.
    pub(crate) fn poll_elapsed(&mut self, waker: &Waker) -> Poll<Elapsed> {
        let shared = &self.deadlines.shared;
        match &mut self.at {
            At::Out => match shared.join(self.limit, waker) {
                Ok(ticket) => self.at = At::Ticket(ticket),
                Err(after) => {
                    self.at = At::timer(after);
                    return self.poll_elapsed(waker);
                }
            },
            At::Ticket(ticket) => {
                if let Some(after) = shared.still_in(self.limit, *ticket, waker) {
                    self.at = At::Out;
                    return Poll::Ready(Elapsed(after));
                }
            }
            At::Timer(sleep, after) => {
                if sleep
                    .as_mut()
                    .poll(&mut Context::from_waker(waker))
                    .is_ready()
                {
                    let after = *after;
                    self.at = At::Out;
                    return Poll::Ready(Elapsed(after));
                }
            }
        }
        Poll::Pending
    }

    /// The call ended: leaves the line.
    pub(crate) fn leave(&mut self) {
        if let At::Ticket(ticket) = std::mem::replace(&mut self.at, At::Out) {
            self.deadlines.shared.leave(self.limit, ticket);
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Under the lock only pushes, pops and single field changes happen: a panic
        // elsewhere cannot leave it half-changed.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Joins the line of `limit` with `waker`: the call's ticket, or the limit when there
    /// is no keeper.
    fn join(self: &Arc<Self>, limit: Limit, waker: &Waker) -> Result<u64, Duration> {
        let after = self.after[limit as usize];
        let mut state = self.lock();
        // Read under the lock, so a line's deadlines are in order.
        let due = Instant::now() + after;
        match state.keeper {
            Keeper::Sleeping => {}
            Keeper::Parked => {
                state.keeper = Keeper::Sleeping;
                self.wake.notify_one();
            }
            Keeper::Unborn => {
                let Some(rt) = crate::client::cleanup::background() else {
                    state.keeper = Keeper::Absent;
                    return Err(after);
                };
                state.keeper = Keeper::Sleeping;
                drop(rt.spawn(keep(Arc::downgrade(self), self.wake.clone())));
            }
            Keeper::Absent => return Err(after),
        }
        state.joined = true;
        let line = &mut state.lines[limit as usize];
        let ticket = line.front + line.slots.len() as u64;
        line.slots.push_back(Slot {
            due,
            waker: Some(waker.clone()),
        });
        Ok(ticket)
    }

    /// Whether `ticket` is still in its line (keeping `waker` as the one to wake), or
    /// was dropped from it when its time was up: then the limit.
    fn still_in(&self, limit: Limit, ticket: u64, waker: &Waker) -> Option<Duration> {
        let mut state = self.lock();
        let line = &mut state.lines[limit as usize];
        let Some(slot) = ticket
            .checked_sub(line.front)
            .and_then(|i| line.slots.get_mut(i as usize))
        else {
            return Some(self.after[limit as usize]);
        };
        match &mut slot.waker {
            Some(w) if !w.will_wake(waker) => *w = waker.clone(),
            _ => {}
        }
        None
    }

    fn leave(&self, limit: Limit, ticket: u64) {
        let ended = {
            let mut state = self.lock();
            let line = &mut state.lines[limit as usize];
            let ended = ticket
                .checked_sub(line.front)
                .and_then(|i| line.slots.get_mut(i as usize))
                .and_then(|s| s.waker.take());
            line.pop_ended();
            ended
        };
        // Dropped outside the lock: a waker's drop may run its task's code.
        drop(ended);
    }

    /// The keeper's pass at `now`: drops the calls whose time is up from their lines
    /// (their wakers, to wake), and says until when to sleep (`None`: park).
    fn expire(&self, now: Instant, up: &mut Vec<Waker>) -> Option<Instant> {
        let mut state = self.lock();
        let mut next = None::<Instant>;
        for line in &mut state.lines {
            line.pop_ended();
            while let Some(slot) = line.slots.front_mut().filter(|s| s.due <= now) {
                up.extend(slot.waker.take());
                line.slots.pop_front();
                line.front += 1;
                line.pop_ended();
            }
            if let Some(front) = line.slots.front() {
                next = Some(next.map_or(front.due, |n| n.min(front.due)));
            }
        }
        if next.is_none() && !state.joined {
            state.keeper = Keeper::Parked;
            return None;
        }
        state.joined = false;
        // A call joining before the next pass is due no earlier than this.
        let soonest = now + self.after[Limit::Call as usize];
        Some(next.map_or(soonest, |n| n.min(soonest)))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // A parked keeper wakes, finds the lines gone, and ends.
        self.wake.notify_one();
    }
}

/// The keeper of one connection's lines, until they are dropped.
async fn keep(shared: Weak<Shared>, wake: Arc<Notify>) {
    let mut up = Vec::new();
    loop {
        let next = match shared.upgrade() {
            Some(shared) => shared.expire(Instant::now(), &mut up),
            None => return,
        };
        for waker in up.drain(..) {
            waker.wake();
        }
        match next {
            // Woken early only as the lines are dropped.
            Some(at) => tokio::select! {
                () = tokio::time::sleep_until(at.into()) => {}
                () = wake.notified() => {}
            },
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    impl Deadlines {
        /// Calls in the line of `limit`, ended ones behind a waiting one included.
        fn in_line(&self, limit: Limit) -> usize {
            self.shared.lock().lines[limit as usize].slots.len()
        }
    }

    /// `call`'s output; fails the test if it does not end within 10 seconds.
    async fn ends<T>(what: &str, call: impl Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .unwrap_or_else(|_| panic!("{what}: never woken"))
    }

    async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < until, "{what}");
            tokio::time::sleep(MS(5)).await;
        }
    }

    #[tokio::test]
    async fn a_call_that_never_ends_times_out_at_its_limit() {
        let d = Deadlines::new(MS(100));
        for limit in [Limit::Call, Limit::Queued] {
            let start = Instant::now();
            let out = ends("never", d.within(limit, std::future::pending::<()>())).await;
            let took = start.elapsed();
            let Err(Elapsed(after)) = out else {
                panic!("{limit:?}: a call that never ends ended")
            };
            assert_eq!(after, d.after(limit));
            assert!(
                took >= after,
                "{limit:?}: timed out after {took:?}, limit {after:?}"
            );
            assert!(took < after + Duration::from_secs(1), "{limit:?}: {took:?}");
            assert_eq!(d.in_line(limit), 0);
        }
        assert_eq!(d.after(Limit::Queued), MS(200));
    }

    /// Calls of random lengths, started at random times on both lines: each ends with
    /// its output if it is well within its limit, times out if it is well past it, and
    /// the lines are empty once all ended. Some are cancelled mid-way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_end_or_time_out_as_their_length_says() {
        let d = Deadlines::new(MS(150));
        for seed in 0..3u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut calls = Vec::new();
            for i in 0..200u64 {
                let limit = if rng.bool() {
                    Limit::Call
                } else {
                    Limit::Queued
                };
                let after = d.after(limit);
                // Well within (at most half the limit), well past (twice it), or never.
                let length = match rng.u32(0..10) {
                    0..6 => Some(after.mul_f64(rng.f64() * 0.5)),
                    6..8 => Some(after * 2),
                    _ => None,
                };
                let start = MS(rng.u64(0..300));
                let cancel = (rng.u32(0..10) == 0).then(|| after.mul_f64(0.1 + rng.f64() * 0.8));
                let d = d.clone();
                calls.push(tokio::spawn(async move {
                    tokio::time::sleep(start).await;
                    let call = async {
                        match length {
                            Some(l) => tokio::time::sleep(l).await,
                            None => std::future::pending().await,
                        }
                        i
                    };
                    let out = match cancel {
                        Some(c) => tokio::time::timeout(c, d.within(limit, call)).await.ok(),
                        None => Some(d.within(limit, call).await),
                    };
                    (limit, length, cancel, out)
                }));
            }
            for call in calls {
                let (limit, length, cancel, out) = ends("random", call).await.unwrap();
                let after = d.after(limit);
                match (length, out) {
                    (_, None) => assert!(cancel.is_some(), "seed {seed}: not cancelled"),
                    (Some(l), Some(Ok(_))) => assert!(l < after, "seed {seed}: {l:?} ended"),
                    (Some(l), Some(Err(e))) => {
                        assert!(l > after, "seed {seed}: {l:?} timed out");
                        assert_eq!(e.0, after);
                    }
                    (None, Some(out)) => assert!(out.is_err(), "seed {seed}: ended"),
                }
            }
            assert_eq!(d.in_line(Limit::Call), 0, "seed {seed}");
            assert_eq!(d.in_line(Limit::Queued), 0, "seed {seed}");
        }
    }

    /// A limit shorter than the connection's keeps its own length on its own timer,
    /// outside the line; a longer one is cut to the connection's.
    #[tokio::test]
    async fn a_limit_of_its_own_is_at_most_the_connections() {
        let d = Deadlines::new(MS(200));
        for (asked, kept) in [(MS(50), MS(50)), (MS(10_000), MS(200))] {
            let start = Instant::now();
            let call = d.within_at_most(asked, std::future::pending::<()>());
            let Err(Elapsed(after)) = ends("at most", call).await else {
                panic!("a call that never ends ended")
            };
            assert_eq!(after, kept);
            assert!(start.elapsed() >= kept, "{asked:?}: {:?}", start.elapsed());
            assert_eq!(d.in_line(Limit::Call), 0);
        }
    }

    /// A call on the shorter limit that joins while the keeper sleeps until a longer
    /// call's deadline still times out at its own.
    #[tokio::test]
    async fn a_shorter_limit_is_kept_behind_a_longer_one() {
        let d = Deadlines::new(MS(300));
        let long = tokio::spawn({
            let d = d.clone();
            async move { d.within(Limit::Queued, std::future::pending::<()>()).await }
        });
        eventually("the long call joined", || d.in_line(Limit::Queued) == 1).await;
        // The keeper's sleep is never past the shortest limit from its last pass.
        let start = Instant::now();
        let short = ends("short", d.within(Limit::Call, std::future::pending::<()>())).await;
        assert!(short.is_err());
        let took = start.elapsed();
        assert!(took < MS(300) + MS(250), "the short call took {took:?}");
        assert!(ends("long", long).await.unwrap().is_err());
    }

    /// After the lines were empty long enough for the keeper to park, a call that joins
    /// wakes it and still times out.
    #[tokio::test]
    async fn a_parked_keeper_wakes_for_the_next_call() {
        let d = Deadlines::new(MS(50));
        let first = d.within(Limit::Call, std::future::pending::<()>());
        assert!(ends("first", first).await.is_err());
        eventually("the keeper parked", || {
            d.shared.lock().keeper == Keeper::Parked
        })
        .await;
        let start = Instant::now();
        let call = d.within(Limit::Call, std::future::pending::<()>());
        assert!(ends("after parking", call).await.is_err());
        assert!(start.elapsed() >= MS(50));
    }

    /// A call first polled by one task and then awaited by another is woken in the
    /// second when its time is up.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_moved_to_another_task_is_woken_there() {
        let d = Deadlines::new(MS(100));
        let mut call = Box::pin({
            let d = d.clone();
            async move { d.within(Limit::Call, std::future::pending::<()>()).await }
        });
        let mut cx = Context::from_waker(Waker::noop());
        assert!(call.as_mut().poll(&mut cx).is_pending());
        let out = ends("moved", tokio::spawn(call)).await.unwrap();
        assert!(out.is_err());
        assert_eq!(d.in_line(Limit::Call), 0);
    }

    /// A call that ends, or is dropped, leaves the line at once; the keeper ends as the
    /// connection's limits are dropped, though it slept until a deadline a minute away.
    #[tokio::test]
    async fn ended_calls_leave_and_the_keeper_ends_with_the_lines() {
        let d = Deadlines::new(MS(60_000));
        let wake = d.shared.wake.clone();
        let mut cx = Context::from_waker(Waker::noop());
        let mut held = Box::pin(d.within(Limit::Call, std::future::pending::<()>()));
        assert!(held.as_mut().poll(&mut cx).is_pending());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let answered = tokio::spawn({
            let d = d.clone();
            async move { d.within(Limit::Call, rx).await }
        });
        eventually("both joined", || d.in_line(Limit::Call) == 2).await;
        tx.send(()).unwrap();
        assert!(matches!(answered.await.unwrap(), Ok(Ok(()))));
        // Ended behind a waiting call: it stays until the front leaves.
        assert_eq!(d.in_line(Limit::Call), 2);
        drop(held);
        assert_eq!(d.in_line(Limit::Call), 0);
        assert_eq!(
            Arc::strong_count(&wake),
            3,
            "the lines, the keeper and this test"
        );
        drop(d);
        eventually("the keeper ended", || Arc::strong_count(&wake) == 1).await;
    }
}
