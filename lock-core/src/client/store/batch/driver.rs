//! A lane's driver: the task that sends what queued behind a call in flight, a batch
//! at a time, and hands each entry its outcome (or, its caller gone, what it left to
//! undo).

use std::sync::Arc;

use redis::Value;

use super::super::scripts::Lua;
use super::{Kind, LaneId, Lanes, Queued, Written, each, entry_replies, entry_reply};
use crate::client::store::Conn;
use crate::client::store::wire::dropped;
use crate::error::LockError;

/// Sends `entries` entries written in `written` as one call of `script`; the reply of
/// each, in order.
async fn send_batch(
    conn: &Conn,
    script: &'static Lua,
    written: &Written,
    entries: usize,
) -> Result<Vec<Value>, LockError> {
    let reply = conn
        .eval_sized(script, conn.timeout(), written.script_size(), |c| {
            written.fill_script(c)
        })
        .await?;
    entry_replies(script, reply, entries)
}

/// Sends the `count` commands written in `written` as one pipeline; the reply of each,
/// in order.
async fn send_pipeline(
    conn: &Conn,
    written: &Written,
    count: usize,
) -> Result<Vec<Result<Value, LockError>>, LockError> {
    let replies = conn.pipeline(&written.pipe()).await?;
    if replies.len() != count {
        return Err(LockError::UnexpectedReply(format!(
            "a pipeline of {count} commands got {} replies",
            replies.len()
        )));
    }
    Ok(replies
        .into_iter()
        .map(|r| r.map_err(LockError::Redis))
        .collect())
}
/// A call in flight on the lane ended (alone or a batch, whose buffers come back in
/// `written`): its place is free; schedules a driver for what queued, if none is on its
/// way.
pub(super) fn hand_over(conn: &Conn, kind: Kind, group: u16, written: Option<Written>) {
    let Some(lanes) = &conn.lanes else {
        return;
    };
    let drive = {
        let mut all = lanes.lock();
        let l = all.entry((kind.id(), group)).or_default();
        l.in_flight = l.in_flight.saturating_sub(1);
        if let Some(w) = written {
            l.spares.give_back(w);
        }
        l.claim_driver(lanes.depth)
    };
    if drive {
        schedule(conn.clone(), kind, group);
    }
}

/// Spawns a driver for what queued on the lane; the caller marked it scheduled.
pub(super) fn schedule(conn: Conn, kind: Kind, group: u16) {
    let Some(lanes) = conn.lanes.clone() else {
        return;
    };
    let driving = Driving {
        lanes,
        kind,
        group,
        batch: Vec::new(),
        written: Written::default(),
        state: State::Scheduled,
    };
    crate::client::cleanup::spawn_task(drive(conn, driving));
}

/// Where a driver is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// On its way: the lane counts it as scheduled.
    Scheduled,
    /// Its batch is in flight: the lane counts it among its calls in flight.
    Sending,
    /// Done, the lane told.
    Done,
}

/// A driver: one batch of a lane. Dropped before it is done (its runtime ended before it
/// ran or mid-call), it fails its batch (each entry as an unknown outcome) and what
/// queued behind it (never sent), and frees its place.
struct Driving {
    lanes: Arc<Lanes>,
    kind: Kind,
    group: u16,
    batch: Vec<Queued>,
    /// The batch's bytes.
    written: Written,
    state: State,
}

impl Driving {
    fn lane(&self) -> LaneId {
        (self.kind.id(), self.group)
    }

    /// Takes this driver's batch from its lane (see `Lane::take_batch`; `one_thread`:
    /// the driver runs on a one-thread runtime). Whether another driver should be
    /// scheduled for what is left.
    fn take(&mut self, one_thread: bool) -> bool {
        let mut all = self.lanes.lock();
        let lane = all.entry(self.lane()).or_default();
        self.state = State::Sending;
        (self.batch, self.written) = lane.take_batch(self.lanes.depth, one_thread);
        lane.claim_driver(self.lanes.depth)
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        if self.state == State::Done {
            return;
        }
        for mut q in self.batch.drain(..) {
            let e = ended(q.op, "the task sending this call's batch ended");
            q.reply.deliver(Err(e), true);
        }
        let queued = {
            let mut all = self.lanes.lock();
            let lane = all.entry(self.lane()).or_default();
            match self.state {
                State::Scheduled => lane.scheduled = false,
                State::Sending => lane.in_flight = lane.in_flight.saturating_sub(1),
                State::Done => {}
            }
            lane.take_queue()
        };
        for mut q in queued {
            let e = ended(q.op, "the task that would send this call ended");
            q.reply.deliver(Err(e), false);
        }
    }
}

/// The error of a call whose driver ended with its runtime: a dropped connection's, no
/// answer from Redis, so what retries an unanswered call (a release sent again in the
/// background, say) retries this one.
fn ended(op: &str, what: &str) -> LockError {
    LockError::Redis(dropped(format!("{op}: {what} (its runtime shut down)")))
}

/// Sends what queued on a lane as one batch, once the tasks already ready have run.
async fn drive(conn: Conn, mut driving: Driving) {
    let (kind, group) = (driving.kind, driving.group);
    use tokio::runtime::RuntimeFlavor::{CurrentThread, MultiThread};
    let flavor = tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor());
    let one_thread = matches!(flavor, Ok(CurrentThread));
    if matches!(flavor, Ok(MultiThread)) {
        // A worker runs a task it spawned next (its LIFO slot), before the callers the
        // same reply woke; one yield puts this driver behind them, so their calls join
        // the batch. A one-thread runtime already runs tasks in the order they came.
        tokio::task::yield_now().await;
    }
    if driving.take(one_thread) {
        schedule(conn.clone(), kind, group);
    }
    leave_out_callers_gone(&mut driving);
    let count = driving.batch.len();
    let replies = match kind {
        _ if count == 0 => Ok(Vec::new()),
        Kind::Script(script) => send_batch(&conn, script, &driving.written, count)
            .await
            .map(|items| items.into_iter().map(entry_reply).collect::<Vec<_>>()),
        Kind::Commands => send_pipeline(&conn, &driving.written, count).await,
    };
    let batch = std::mem::take(&mut driving.batch);
    let written = std::mem::take(&mut driving.written);
    driving.state = State::Done;
    drop(driving);
    hand_over(&conn, kind, group, Some(written));
    match replies {
        Ok(items) => {
            for (mut q, v) in batch.into_iter().zip(items) {
                q.reply.deliver(v, true);
            }
        }
        Err(e) => {
            for mut q in batch {
                q.reply.deliver(Err(each(&e, q.op)), true);
            }
        }
    }
}

/// Leaves out of the batch the calls whose callers went away before it was sent (what
/// they left to undo learns nothing was sent), and their bytes.
fn leave_out_callers_gone(driving: &mut Driving) {
    let before = driving.batch.len();
    driving.batch.retain_mut(|q| !q.reply.leave_out_if_gone());
    if driving.batch.len() != before {
        driving
            .written
            .retain(driving.batch.iter_mut().map(|q| &mut q.span));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call whose driver ended got no answer: it is retried as one Redis did not
    /// answer is (a release, in the background), and says what happened.
    #[test]
    fn a_call_whose_driver_ended_got_no_answer() {
        let e = ended("release", "the task sending this call's batch ended");
        assert!(e.is_no_answer() && e.is_redis(), "{e:?}");
        assert!(e.to_string().contains("release"), "{e}");
        assert!(e.to_string().contains("runtime shut down"), "{e}");
    }
}
