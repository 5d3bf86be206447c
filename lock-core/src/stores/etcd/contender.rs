//! One acquisition in the Go `concurrency.Mutex` protocol: the contender key
//! `<prefix>/<lease id in hex>` created under the session lease in a transaction
//! guarded by `CreateRevision == 0` (which also reads the owner, the key of lowest
//! create revision under the prefix, so an uncontended acquisition is one request);
//! a waiter then watches only the deletion of the key created just before its own.

use std::time::Duration;

use etcd_client::{
    self as etcd, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse,
};
use tokio::time::Instant;

use super::members::Members;
use super::session::Lease;
use crate::error::LockError;

/// One transaction, on whichever member answers.
pub(super) async fn txn_call(
    members: &Members,
    what: &str,
    txn: &Txn,
) -> Result<etcd::TxnResponse, LockError> {
    members
        .call(what, |c| {
            let txn = txn.clone();
            async move { c.kv_client().txn(txn).await }
        })
        .await
}

/// Where the queue stands after our key is in it.
pub(super) enum Queued {
    /// Ours is the oldest key: we hold the lock, fenced by its create revision.
    Owner(i64),
    /// Keys created before ours hold or wait; ours has this create revision.
    Behind(i64),
}

/// The contenders a key waits behind: the keys in `[start, end)`.
pub(super) struct Queue {
    pub(super) start: String,
    pub(super) end: String,
}

impl Queue {
    /// `GetOptions` for its one key of `order` create revision (read at `start`).
    pub(super) fn top(&self, order: SortOrder) -> GetOptions {
        GetOptions::new()
            .with_range(self.end.as_str())
            .with_sort(SortTarget::Create, order)
            .with_limit(1)
    }
}

fn first_kv(op: Option<&TxnOpResponse>) -> Option<&etcd::KeyValue> {
    match op {
        Some(TxnOpResponse::Get(get)) => get.kvs().first(),
        _ => None,
    }
}

pub(super) fn unexpected(what: &str) -> LockError {
    LockError::Store {
        store: super::STORE,
        message: format!("unexpected answer from etcd: {what}"),
    }
}

/// Whether etcd refused a request for its lease (expired or revoked).
fn lease_not_found(e: &etcd::Error) -> bool {
    matches!(e, etcd::Error::GRpcStatus(s) if s.message().contains("requested lease not found"))
}

/// Puts `key` (with `value`) under `lease`, or finds it there from an earlier attempt
/// whose answer was lost; answers where it stands behind the keys of `queue`, or
/// `None` if etcd refused the key for its lease (gone: nothing was made).
pub(super) async fn enqueue(
    members: &Members,
    (queue, key, value): (&Queue, &str, &[u8]),
    lease: Lease,
) -> Result<Option<Queued>, LockError> {
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease.id))),
            TxnOp::get(queue.start.as_str(), Some(queue.top(SortOrder::Ascend))),
        ])
        .or_else([
            TxnOp::get(key, None),
            TxnOp::get(queue.start.as_str(), Some(queue.top(SortOrder::Ascend))),
        ]);
    // Sent again on another member, it finds the key the first one may have made.
    let answer = members
        .call("queueing for the lock", |c| {
            let txn = txn.clone();
            async move {
                match c.kv_client().txn(txn).await {
                    Err(e) if lease_not_found(&e) => Ok(None),
                    answer => answer.map(Some),
                }
            }
        })
        .await?;
    let Some(answer) = answer else {
        return Ok(None);
    };
    let ops = answer.op_responses();
    let ours = if answer.succeeded() {
        answer
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| unexpected("a transaction without a header"))?
    } else {
        first_kv(ops.first())
            .map(etcd::KeyValue::create_revision)
            .ok_or_else(|| unexpected("our key neither absent nor present"))?
    };
    // The oldest key of `queue` (which may or may not hold ours) holds us back if it is
    // older than ours.
    Ok(Some(match first_kv(ops.get(1)) {
        Some(oldest) if oldest.create_revision() < ours => Queued::Behind(ours),
        _ => Queued::Owner(ours),
    }))
}

/// Waits until every key of `queue` created before revision `ours` is deleted:
/// `true` then, `false` if `deadline` came first. Each turn watches the newest of
/// them only, so a release wakes one waiter.
pub(super) async fn await_predecessors(
    members: &Members,
    queue: &Queue,
    ours: i64,
    deadline: Instant,
    recheck: Duration,
) -> Result<bool, LockError> {
    loop {
        let options = queue
            .top(SortOrder::Descend)
            .with_max_create_revision(ours - 1);
        let newest = members
            .call("looking for the key before ours", |c| {
                let options = options.clone();
                async move { c.kv_client().get(queue.start.as_str(), Some(options)).await }
            })
            .await?;
        let Some(before) = newest.kvs().first() else {
            return Ok(true);
        };
        let revision = newest.header().map_or(0, |h| h.revision());
        let predecessor = (before.key(), before.create_revision());
        // Looked at again after `recheck` whatever the watch says: its member may
        // have stopped answering.
        let deleted = tokio::time::timeout(recheck, await_deletion(members, predecessor, revision));
        match tokio::time::timeout_at(deadline, deleted).await {
            Err(_) => return Ok(false),
            // Deleted, the watch ended (compacted, reconnected) or due for a look:
            // look again.
            Ok(Err(_) | Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e),
        }
    }
}

/// Resolves once the key `(key, its create revision)`, seen present at `revision`, is
/// deleted, or its watch ends.
///
/// The watch starts from the store's revision when it is made, not from `revision`:
/// etcd serves a watch that starts in the past from a loop that catches up every
/// 100 ms, which on a busy lock delays most handoffs by that much. What the watch
/// cannot see, a deletion between `revision` and its start, one read finds instead.
pub(super) async fn await_deletion(
    members: &Members,
    (key, created): (&[u8], i64),
    revision: i64,
) -> Result<(), LockError> {
    let mut stream = members
        .call("watching the key before ours", |c| async move {
            c.watch_client().watch(key, None).await
        })
        .await?;
    // The first answer says the watch is in place, and from which revision on.
    match stream.message().await {
        Ok(Some(answer)) if answer.created() && !answer.canceled() => {
            let from = answer.header().map_or(i64::MAX, |h| h.revision());
            if from > revision && !is_there(members, key, created).await? {
                return Ok(());
            }
        }
        _ => return Ok(()),
    }
    loop {
        match stream.message().await {
            Ok(Some(answer)) => {
                if answer.canceled()
                    || answer
                        .events()
                        .iter()
                        .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(());
                }
            }
            Ok(None) | Err(_) => return Ok(()),
        }
    }
}

/// Deletes `key`: `true` if it was there. Our keys are named after our lease, and a
/// client's scopes take turns on a name until its key is known deleted, so no one but
/// this client can have made the key this deletes. With `created` (a held grant's
/// create revision) only that grant's key is deleted: a delete sent again, or delivered
/// late by a member that did not answer in time, cannot take a later grant's key of the
/// same name.
pub(super) async fn delete(
    members: &Members,
    key: &str,
    created: Option<i64>,
) -> Result<bool, LockError> {
    let Some(created) = created else {
        let answer = members
            .call("deleting our key", |c| async move {
                c.kv_client().delete(key, None).await
            })
            .await?;
        return Ok(answer.deleted() > 0);
    };
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, created)])
        .and_then([TxnOp::delete(key, None)]);
    Ok(txn_call(members, "deleting our key", &txn)
        .await?
        .succeeded())
}

/// Whether `key` still exists with create revision `created`: one read.
pub(super) async fn is_there(
    members: &Members,
    key: &[u8],
    created: i64,
) -> Result<bool, LockError> {
    let there = still_there(members, &[(key, created)]).await?;
    Ok(there.first().copied().unwrap_or(false))
}

/// The most operations etcd takes in one transaction (its `--max-txn-ops` default).
const MAX_TXN_OPS: usize = 128;

/// Whether each of `keys` still exists with its create revision: one read per
/// [`MAX_TXN_OPS`] keys, all at once.
pub(super) async fn still_there(
    members: &Members,
    keys: &[(&[u8], i64)],
) -> Result<Vec<bool>, LockError> {
    let reads = keys
        .chunks(MAX_TXN_OPS)
        .map(|k| still_there_at_once(members, k));
    let answers = futures_util::future::try_join_all(reads).await?;
    Ok(answers.into_iter().flatten().collect())
}

/// [`still_there`] in one transaction.
async fn still_there_at_once(
    members: &Members,
    keys: &[(&[u8], i64)],
) -> Result<Vec<bool>, LockError> {
    let gets: Vec<TxnOp> = keys
        .iter()
        .map(|(key, _)| TxnOp::get(*key, Some(GetOptions::new().with_keys_only())))
        .collect();
    let answer = txn_call(
        members,
        "checking keys are there",
        &Txn::new().and_then(gets),
    )
    .await?;
    let ops = answer.op_responses();
    if ops.len() != keys.len() {
        return Err(unexpected("a read of keys missed some"));
    }
    Ok(keys
        .iter()
        .zip(&ops)
        .map(|((_, rev), op)| first_kv(Some(op)).is_some_and(|kv| kv.create_revision() == *rev))
        .collect())
}
