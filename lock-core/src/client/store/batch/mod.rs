//! Coalescing of concurrent calls: what arrives on a lane while an earlier call of that
//! lane is in flight goes to Redis together, in one redis-rs call. A lane is one
//! script on one key group (its queued entries become one call of the script over all
//! their keys) or the plain commands of one key group (queued commands become one
//! pipeline: N `SET NX PX` in one write, one reply per command).
//!
//! How a batch forms, per lane:
//! - An idle lane (nothing in flight, nothing queued) that is quiet: the call goes at
//!   once, on the caller's own future ([`Turn::Alone`]); no timer, no task, no added
//!   latency.
//! - An idle lane that is busy (a call has queued behind another, and no batch of one
//!   has gone since): the call queues, as below, and the calls of the tasks running
//!   beside it join its batch. Going alone there would split each wave of calls in
//!   two (the one alone, written at once, and a batch of the rest): two writes and two
//!   replies to wait for, on each side, for one wave. A batch of one makes the lane
//!   quiet again, so a lone caller pays the driver's hop once after a busy spell.
//! - Otherwise the call is queued ([`Turn::Queued`]), and while fewer than the lane's
//!   limit of calls are in flight (`LockConfig::with_batches_in_flight`, none by
//!   default), a driver task is scheduled for it. The driver first lets every task
//!   that is ready run (on a multi-thread runtime one yield: a task spawned by a worker
//!   would run next, before the callers the same reply woke), then sends the first
//!   [`batch_size`] of what queued as one call, and another driver takes the rest. So
//!   a batch is what arrived while the lane's calls were in flight and the client was
//!   busy, not what arrived within a timer, and a wave of calls reaches Redis in a few
//!   parts.
//!   With several calls in flight the server works on one batch while the client
//!   handles the replies of another and forms the next: neither side waits on the
//!   other's round trip. At the limit, calls queue until one in flight ends.
//! - The driver runs on a live runtime (`cleanup::spawn_task`); if its runtime ends
//!   before it sent, or mid-call, its batch fails (as any unknown outcome: what each
//!   entry leaves is undone) and so does what queued behind it (never sent), and its
//!   place is freed, so no later call queues behind a driver that will never run.
//! - A queued call's bytes go straight into buffers its lane keeps ([`written`]), and
//!   its reply comes back through a slot of its own ([`reply`]).
//!
//! Per entry, nothing changes: the scripts loop over their entries (the same keys and
//! arguments per entry, one file each, laid out in their headers) and answer one reply
//! per entry (a batch of one: that reply alone, one array level less for redis-rs to
//! parse), `{'error', message}` for an entry that failed (`redis.pcall`); a pipeline
//! answers one reply per command, an error reply for a command that failed. So each
//! caller gets its own reply or error, and a task's calls keep their order (it awaits
//! each before the next). Two batches of one lane in flight at once may reach Redis in
//! either order (their drivers race to the connection): nothing relies on an order
//! between different callers' calls, and a lane capped at one batch keeps it.
//! A call that fails as a whole (Redis down, a timeout) fails every entry with that
//! error. An entry whose caller went away before its batch was sent is left out.
//! What a queued call leaves to undo is given with its wait ([`Pending::or_undo`]) and
//! run once the outcome is known: after an error, or after a reply its caller is no
//! longer there to take (the lock's acquisition gives such a grant back), or with
//! nothing sent if the call was left out; so an undo never overtakes what it undoes.

use std::collections::HashMap;
use std::sync::Mutex;

use redis::{FromRedisValue, Value};

use super::deadline::Limit;
pub(crate) use super::entry::{Entry, builder};
use super::scripts::Lua;
use super::{Args, Conn, decode};
use crate::error::LockError;

mod driver;
mod reply;
mod written;

use driver::{hand_over, schedule};
pub(crate) use reply::Pending;
use reply::{ReplyTo, each};
use written::{Span, Spares, Written};

/// The most entries one call carries.
pub(crate) const MAX_BATCH: usize = 128;

/// The fewest entries a batch split off a longer queue carries.
const MIN_SPLIT: usize = 16;

/// The most entries a lane's batch takes on a one-thread runtime when none of the
/// lane's calls is in flight ([`batch_size`]).
const LEAD: usize = 8;

/// How many of `queued` waiting calls the next batch takes, with at most `depth`
/// batches of the lane in flight. Where several may fly, a wave of calls goes as a few
/// batches (a quarter of it each, at least [`MIN_SPLIT`]): Redis starts on the first
/// while the client still writes the next, and the client takes the first's replies
/// while Redis runs the rest, so neither side waits for the whole wave (one batch per
/// wave left each side idle while the other worked). Capped at one in flight, each
/// batch waits for the one before: a batch takes all it can.
///
/// `lead`: the driver runs on a one-thread runtime and none of the lane's calls is in
/// flight, so Redis has nothing of the lane to work on while that one thread writes
/// the wave: the batch takes at most [`LEAD`], which Redis starts on at once. At 64
/// tasks on one thread that took 1.2x to 1.3x the lock cycles per second of batches of
/// a quarter at no cost in instructions per cycle; on a multi-thread runtime, whose
/// other worker writes while one waits, it cost 7%, so only one thread leads.
fn batch_size(queued: usize, depth: usize, lead: bool) -> usize {
    let n = match depth {
        1 => queued,
        _ if lead => LEAD,
        _ => queued.div_ceil(4).max(MIN_SPLIT),
    };
    n.min(queued).min(MAX_BATCH)
}

/// What a lane sends.
#[derive(Clone, Copy)]
enum Kind {
    /// Calls of one script: a batch is one call of it over every entry.
    Script(&'static Lua),
    /// Plain commands: a batch is one pipeline.
    Commands,
}

impl Kind {
    /// Tells the lanes of one group apart: a script's address (each is a static), or 0.
    fn id(self) -> usize {
        match self {
            Self::Script(script) => std::ptr::from_ref(script) as usize,
            Self::Commands => 0,
        }
    }
}

/// A queued call: its bytes are in its lane's [`Written`] at `span`.
struct Queued {
    span: Span,
    op: &'static str,
    reply: ReplyTo,
}

type LaneId = (usize, u16);

/// One lane: how many of its calls are in flight, whether a driver is on its way for
/// what queued, what queued (and its bytes), and whether calls have been arriving
/// together.
#[derive(Default)]
struct Lane {
    in_flight: usize,
    scheduled: bool,
    queue: Vec<Queued>,
    written: Written,
    /// Buffers for the next batches' bytes, given back by batches that are over.
    spares: Spares,
    /// A call queued behind another, and no batch of one has gone since: calls arrive
    /// together, so even a call that finds the lane idle queues, for the batch that the
    /// tasks running with it will join.
    busy: bool,
}

impl Lane {
    /// Whether a new call goes alone, taking the lane's place in flight: the lane is
    /// idle and quiet. A call that will queue behind another marks the lane busy.
    fn goes_alone(&mut self) -> bool {
        let idle = self.in_flight == 0 && self.queue.is_empty();
        if idle && !self.busy {
            self.in_flight = 1;
            return true;
        }
        self.busy |= !idle;
        false
    }

    /// Takes the first of what queued ([`batch_size`] entries, with at most `depth`
    /// batches in flight; `one_thread`: its driver runs on a one-thread runtime), and
    /// its bytes, as a batch in flight. A batch of one (no call joined it) makes the
    /// lane quiet: the next call to find it idle goes alone.
    fn take_batch(&mut self, depth: usize, one_thread: bool) -> (Vec<Queued>, Written) {
        self.scheduled = false;
        let n = batch_size(self.queue.len(), depth, one_thread && self.in_flight == 0);
        self.in_flight += 1;
        self.busy = n > 1;
        let mut batch = std::mem::replace(&mut self.written, self.spares.take());
        batch.move_to(
            &mut self.written,
            self.queue[n..].iter_mut().map(|q| &mut q.span),
        );
        (self.queue.drain(..n).collect(), batch)
    }

    /// Everything queued, taken away (its bytes dropped).
    fn take_queue(&mut self) -> Vec<Queued> {
        self.written.clear();
        std::mem::take(&mut self.queue)
    }

    /// Marks a driver on its way and answers true if one should be scheduled for what
    /// queued: there is some, none is on its way, and the lane has a free place.
    fn claim_driver(&mut self, depth: usize) -> bool {
        let wanted = !self.queue.is_empty() && !self.scheduled && self.in_flight < depth;
        self.scheduled |= wanted;
        wanted
    }
}

type LaneMap = HashMap<LaneId, Lane, foldhash::fast::RandomState>;

/// Every lane of one connection. A lane stays once used (idle, its queue empty), so a
/// call finds it without an insert and a removal each time: there are at most a few
/// kinds of call per hash slot.
pub(crate) struct Lanes {
    lanes: Mutex<LaneMap>,
    /// The most calls of one lane in flight at once (the configuration's, at least 1).
    depth: usize,
    /// Reply slots for queued calls.
    slots: reply::Slots,
}

impl Lanes {
    pub(crate) fn new(depth: usize) -> Self {
        Self {
            lanes: Mutex::default(),
            depth,
            slots: reply::Slots::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LaneMap> {
        // A panic while holding the lock cannot leave the map half-changed (only
        // single flag changes, pushes and takes happen under it).
        self.lanes.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Conn {
    /// Calls waiting behind a call in flight, over every lane.
    pub(crate) fn queued_calls(&self) -> usize {
        self.lanes
            .as_ref()
            .map_or(0, |l| l.lock().values().map(|l| l.queue.len()).sum())
    }
}

/// A caller's place in a lane.
pub(crate) enum Turn<'c, F> {
    /// Nothing of this lane is in flight: send now, on the caller's future (the entry
    /// builder comes back unused). The call counts as in flight until the [`Alone`] is dropped.
    Alone(Alone<'c>, F),
    /// Queued behind a call in flight: the reply arrives with a later batch.
    Queued(Pending<'c>),
}

/// The caller's place in flight on its lane; dropping it frees the place (and schedules
/// a driver for what queued, if none is on its way). It borrows the connection its
/// caller calls on: the connection is cloned only to start a driver.
pub(crate) struct Alone<'c> {
    lane: Option<(&'c Conn, Kind, u16)>,
}

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        if let Some((conn, kind, group)) = self.lane.take() {
            hand_over(conn, kind, group, None);
        }
    }
}

impl Conn {
    /// A place for a call of `script` on `key`'s group: alone (send now, with
    /// [`send_one`](Self::send_one)), or queued with the entry `entry` builds from an
    /// empty one (built only then). With batching off, always alone.
    pub(crate) fn turn<F: FnOnce(Entry<'_>) -> Entry<'_>>(
        &self,
        script: &'static Lua,
        key: &str,
        entry: F,
    ) -> Turn<'_, F> {
        self.take_turn(Kind::Script(script), script.op(), key, entry, |f, w| {
            w.entry(script.key_columns(), f)
        })
    }

    /// A place for the plain command `op` on `key`'s group: alone (send now), or queued
    /// with the command `command` builds (only then, in the empty buffer it is handed),
    /// to go in the next pipeline.
    /// With batching off, always alone.
    pub(crate) fn turn_command<F: FnOnce(Args) -> Args>(
        &self,
        op: &'static str,
        key: &str,
        command: F,
    ) -> Turn<'_, F> {
        self.take_turn(Kind::Commands, op, key, command, |f, w| Some(w.command(f)))
    }

    fn take_turn<F>(
        &self,
        kind: Kind,
        op: &'static str,
        key: &str,
        build: F,
        write: impl FnOnce(F, &mut Written) -> Option<Span>,
    ) -> Turn<'_, F> {
        let Some(lanes) = &self.lanes else {
            return Turn::Alone(Alone { lane: None }, build);
        };
        let group = self.group(key);
        let mut all = lanes.lock();
        let lane = all.entry((kind.id(), group)).or_default();
        if lane.goes_alone() {
            let alone = Alone {
                lane: Some((self, kind, group)),
            };
            return Turn::Alone(alone, build);
        }
        let (mut reply, pending) = lanes.slots.slot(op, self.deadlines.place(Limit::Queued));
        match write(build, &mut lane.written) {
            Some(span) => lane.queue.push(Queued { span, op, reply }),
            None => reply.deliver(
                Err(LockError::UnexpectedReply(format!(
                    "{op}: a queued entry did not fit its script's layout of keys"
                ))),
                false,
            ),
        }
        let drive = lane.claim_driver(lanes.depth);
        drop(all);
        if drive {
            schedule(self.clone(), kind, group);
        }
        Turn::Queued(pending)
    }

    /// One entry's call of a batched script: alone as a batch of one, or queued. The
    /// entry's reply as `T` (an error reply is an error).
    pub(crate) async fn call<T: FromRedisValue>(
        &self,
        script: &'static Lua,
        key: &str,
        entry: impl FnOnce(Entry<'_>) -> Entry<'_>,
    ) -> Result<T, LockError> {
        let reply = match self.turn(script, key, entry) {
            Turn::Queued(pending) => pending.await,
            Turn::Alone(alone, entry) => {
                let reply = self.send_one(script, entry).await;
                // The lane is handed over whether the call succeeded or not.
                drop(alone);
                reply
            }
        };
        decode(script.op(), reply?)
    }

    /// Sends the entry `entry` builds as a call of `script` alone, its command written
    /// directly; its reply (an error entry is an error).
    pub(crate) async fn send_one(
        &self,
        script: &'static Lua,
        entry: impl FnOnce(Entry<'_>) -> Entry<'_>,
    ) -> Result<Value, LockError> {
        let entry = entry(Entry::direct(script));
        let Some(cmd) = entry.into_command() else {
            // The builder returned another entry than the one it was given.
            return Err(LockError::UnexpectedReply(format!(
                "{}: a call alone was built as a queued entry",
                script.op()
            )));
        };
        entry_reply(self.eval_command(script, self.timeout(), cmd).await?)
    }
}

/// The replies of a call of `script` over `entries` entries, in order: a batch of one
/// answers its entry's reply alone.
pub(crate) fn entry_replies(
    script: &Lua,
    reply: Value,
    entries: usize,
) -> Result<Vec<Value>, LockError> {
    match reply {
        one if entries == 1 => Ok(vec![one]),
        Value::Array(items) if items.len() == entries => Ok(items),
        other => Err(LockError::UnexpectedReply(format!(
            "{}.lua returned {other:?} for {entries} entries",
            script.op(),
        ))),
    }
}

/// One entry's reply: `{'error', message}` becomes the entry's error. (A nested error
/// reply would fail the whole reply in redis-rs, and so every entry of the batch.)
pub(crate) fn entry_reply(v: Value) -> Result<Value, LockError> {
    if let Value::Array(items) = &v
        && let [Value::BulkString(tag), Value::BulkString(message)] = items.as_slice()
        && tag == b"error"
    {
        let message = String::from_utf8_lossy(message).into_owned();
        return Err(LockError::Redis(redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "the script failed for this entry",
            message,
        ))));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The batches a wave of `queued` calls goes as, each taken from what is left.
    fn batches(mut queued: usize, depth: usize) -> Vec<usize> {
        let mut out = Vec::new();
        while queued > 0 {
            let n = batch_size(queued, depth, false);
            assert!(n >= 1, "a batch of nothing from {queued} queued");
            out.push(n);
            queued -= n;
        }
        out
    }

    #[test]
    fn a_wave_goes_as_a_few_batches_where_several_may_fly() {
        for queued in 0..=1000 {
            for depth in [1, 2, 3, 8, usize::MAX] {
                let b = batches(queued, depth);
                assert_eq!(b.iter().sum::<usize>(), queued, "{b:?}");
                assert!(b.iter().all(|&n| n <= MAX_BATCH), "{b:?}");
                if depth == 1 {
                    // Each batch waits for the one before: it takes all it can.
                    assert!(b.iter().rev().skip(1).all(|&n| n == MAX_BATCH), "{b:?}");
                    continue;
                }
                // Only the last is under the smallest split, and it is what was left.
                assert!(b.iter().rev().skip(1).all(|&n| n >= MIN_SPLIT), "{b:?}");
                if queued <= MIN_SPLIT {
                    assert_eq!(b.len(), usize::from(queued > 0), "{b:?}");
                } else if queued >= 2 * MIN_SPLIT {
                    // Never the whole wave at once: Redis starts on the first part.
                    assert!(b.len() >= 2 && b[0] <= queued / 2, "{queued}: {b:?}");
                }
            }
        }
    }

    #[test]
    fn on_one_thread_a_lane_with_nothing_in_flight_leads_with_a_short_batch() {
        for queued in 1..=300 {
            for depth in [2, 8, usize::MAX] {
                let n = batch_size(queued, depth, true);
                assert_eq!(n, queued.min(LEAD), "{queued} queued, depth {depth}");
                assert!(n <= batch_size(queued, depth, false), "{queued}: {n}");
            }
            // At most one in flight: the next batch cannot go until this one is back,
            // so this one takes all it can, leading or not.
            assert_eq!(batch_size(queued, 1, true), queued.min(MAX_BATCH));
        }
    }
}
