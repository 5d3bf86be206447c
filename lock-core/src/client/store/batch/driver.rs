//! A lane's driver: the task that sends what queued behind a call in flight, a batch
//! at a time, and hands each entry its reply (or its cleanup the outcome).

use std::sync::Arc;

use redis::Value;

use super::{Entry, Item, Kind, LaneId, Lanes, MAX_BATCH, Queued, entry_reply, send_batch};
use crate::client::store::Conn;
use crate::error::LockError;

/// Sends the commands of `batch` as one pipeline; the reply of each, in order.
async fn send_pipeline(
    conn: &Conn,
    batch: &mut [Queued],
) -> Result<Vec<Result<Value, LockError>>, LockError> {
    let mut pipe = redis::Pipeline::with_capacity(batch.len());
    for q in batch.iter_mut() {
        if let Item::Command(c) = &mut q.item {
            // Moved, not copied: the entry keeps only what its delivery needs.
            pipe.add_command(std::mem::replace(&mut c.cmd, redis::Cmd::new()));
        }
    }
    let replies = conn.pipeline(&pipe).await?;
    if replies.len() != batch.len() {
        return Err(LockError::UnexpectedReply(format!(
            "a pipeline of {} commands got {} replies",
            batch.len(),
            replies.len()
        )));
    }
    Ok(replies
        .into_iter()
        .map(|r| r.map_err(LockError::Redis))
        .collect())
}
/// The error a failed batch gives its entry `op`: the one it would have had alone.
fn each(e: &LockError, op: &'static str) -> LockError {
    match e {
        LockError::RedisTimeout { after, .. } => LockError::RedisTimeout { op, after: *after },
        LockError::Redis(r) => LockError::Redis(r.clone()),
        other => LockError::UnexpectedReply(other.to_string()),
    }
}
/// The lane's own call ended: hand what queued to a driver task, or mark it idle.
pub(super) fn hand_over(conn: Conn, kind: Kind, group: u16) {
    let Some(lanes) = conn.lanes.clone() else {
        return;
    };
    let lane = (kind.id(), group);
    let mut all = lanes.lock();
    let l = all.entry(lane).or_default();
    if l.queue.is_empty() {
        l.busy = false;
        return;
    }
    drop(all);
    let driving = Driving {
        lanes,
        lane,
        in_flight: Vec::new(),
        emptied: false,
    };
    crate::client::cleanup::spawn_task(drive(conn, driving, kind));
}

/// A lane's driver: while it lives the lane is busy. Dropped before it emptied the lane
/// (its runtime ended mid-call), it fails the batch in flight, each entry to its
/// cleanup as an unknown outcome, and frees the lane, failing what queued behind.
struct Driving {
    lanes: Arc<Lanes>,
    lane: LaneId,
    in_flight: Vec<Queued>,
    /// The driver emptied and freed the lane (it may be another call's again).
    emptied: bool,
}

impl Driving {
    /// What queued next, up to [`MAX_BATCH`] entries; `None` once nothing is left, the
    /// lane freed.
    fn next_batch(&mut self) -> Option<Vec<Queued>> {
        let mut all = self.lanes.lock();
        let lane = all.entry(self.lane).or_default();
        if lane.queue.is_empty() {
            lane.busy = false;
            self.emptied = true;
            return None;
        }
        let n = lane.queue.len().min(MAX_BATCH);
        Some(lane.queue.drain(..n).collect())
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        if self.emptied {
            return;
        }
        for q in self.in_flight.drain(..) {
            let op = q.op;
            deliver(
                q,
                Err(LockError::UnexpectedReply(format!(
                    "{op}: the task sending this call's batch ended (its runtime shut down)"
                ))),
            );
        }
        let queued = {
            let mut all = self.lanes.lock();
            let lane = all.entry(self.lane).or_default();
            lane.busy = false;
            std::mem::take(&mut lane.queue)
        };
        for q in queued {
            if let Some(cleanup) = q.item.into_cleanup() {
                cleanup(None);
            }
        }
    }
}

/// Sends what queued on a lane, a batch at a time, until nothing is left.
async fn drive(conn: Conn, mut driving: Driving, kind: Kind) {
    while let Some(batch) = driving.next_batch() {
        // Callers gone before sending: left out.
        let (gone, batch): (Vec<Queued>, Vec<Queued>) =
            batch.into_iter().partition(|q| q.reply.is_closed());
        for q in gone {
            if let Some(cleanup) = q.item.into_cleanup() {
                cleanup(None);
            }
        }
        if batch.is_empty() {
            continue;
        }
        driving.in_flight = batch;
        let replies = match kind {
            Kind::Script(script) => {
                let entries: Vec<&Entry> = driving
                    .in_flight
                    .iter()
                    .filter_map(|q| match &q.item {
                        Item::Script(e) => Some(e),
                        Item::Command(_) => None,
                    })
                    .collect();
                send_batch(&conn, script, &entries)
                    .await
                    .map(|items| items.into_iter().map(entry_reply).collect::<Vec<_>>())
            }
            Kind::Commands => send_pipeline(&conn, &mut driving.in_flight).await,
        };
        let batch = std::mem::take(&mut driving.in_flight);
        match replies {
            Ok(items) => {
                for (q, v) in batch.into_iter().zip(items) {
                    deliver(q, v);
                }
            }
            Err(e) => {
                for q in batch {
                    let e = each(&e, q.op);
                    deliver(q, Err(e));
                }
            }
        }
    }
}

/// Hands an entry its reply; what its caller will not act on goes to its cleanup.
fn deliver(q: Queued, reply: Result<Value, LockError>) {
    let Queued {
        item,
        op,
        reply: caller,
    } = q;
    let left = match reply {
        Err(e) => {
            let copy = each(&e, op);
            let _ = caller.send(Err(e));
            Some(Err(copy))
        }
        Ok(v) => caller.send(Ok(v)).err(),
    };
    if let (Some(left), Some(cleanup)) = (left, item.into_cleanup()) {
        cleanup(Some(left));
    }
}
