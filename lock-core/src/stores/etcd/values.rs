//! What a user reads and writes on etcd beside a hold: writes fenced by a hold, the
//! value a hold keeps ([`LockOptions::value`](crate::LockOptions::value)) and who holds
//! a lock now, as Go's `concurrency.Election` reads and writes them.

use etcd_client::{self as etcd, PutOptions, SortOrder, TxnOp};

use super::contender::{self, Queue};
use super::{EtcdBackend, EtcdGuard};
use crate::client::store::key::{self, LockMode, LockName};
use crate::error::LockError;
use crate::lock::registry::Loss;
use crate::owner::FencingToken;
use crate::stores::locks::Locks;

/// Who holds a plain lock on etcd (or leads an election), as Go's `Election.Leader`
/// reads it: the oldest contender key under the lock's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdHolder {
    /// The holder's contender key.
    pub key: String,
    /// The value it keeps ([`LockOptions::value`](crate::LockOptions::value), or Go's
    /// `Campaign` and `Proclaim` values).
    pub value: Vec<u8>,
    /// Its fencing token (the key's create revision): an election's term.
    pub token: FencingToken,
}

impl Locks<EtcdBackend> {
    /// Runs `ops` in one etcd transaction that applies only while `guard` holds its
    /// lock (`If(CreateRevision(its key) == its token)`): the fenced write. Refused, it
    /// answers the loss as an error and marks nothing; the guard learns of the loss
    /// from the watch on its key. A read hold, shared with other readers, fences
    /// nothing: [`LockError::NoFencingToken`].
    pub async fn write_fenced(
        &self,
        guard: &EtcdGuard,
        ops: impl Into<Vec<etcd::TxnOp>>,
    ) -> Result<etcd::TxnResponse, LockError> {
        if !guard.keys().mode.is_fenced() {
            return Err(LockError::NoFencingToken {
                key: guard.name().to_owned(),
                reason: "a read hold, which others share, fences no write: take the lock \
                         for writing",
            });
        }
        let hold = guard.record();
        let txn = etcd::Txn::new()
            .when([etcd::Compare::create_revision(
                hold.key.as_str(),
                etcd::CompareOp::Equal,
                hold.token,
            )])
            .and_then(ops);
        let answer = contender::txn_call(&self.backend().members, "a fenced write", &txn).await?;
        if answer.succeeded() {
            Ok(answer)
        } else {
            Err(Loss::Expired.error(guard.name()))
        }
    }

    /// Replaces the value `guard`'s key keeps, while it holds (Go's
    /// `Election.Proclaim`): a leader announcing a new address, say. Answers the loss
    /// as an error if the lock is no longer held.
    pub async fn proclaim(
        &self,
        guard: &EtcdGuard,
        value: impl Into<Vec<u8>>,
    ) -> Result<(), LockError> {
        let hold = guard.record();
        let put = TxnOp::put(
            hold.key.as_str(),
            value.into(),
            Some(PutOptions::new().with_lease(hold.lease.id)),
        );
        self.write_fenced(guard, [put]).await.map(drop)
    }

    /// Who holds the plain lock `name` now (leads the election `name`), with the value
    /// its key keeps; `None` if nobody holds or waits. A Go service's `Election.Leader`
    /// on [`lock_prefix`](Self::lock_prefix) reads the same.
    ///
    /// ```no_run
    /// # async fn demo(locks: lock_core::EtcdLocks) -> Result<(), lock_core::LockError> {
    /// use lock_core::Election;
    ///
    /// // Candidates say where they serve; anyone can ask who leads.
    /// let election = Election::new(locks.clone(), "scheduler").value("10.0.0.7:8080");
    /// let _leading = election.campaign(std::time::Duration::from_secs(30)).await?;
    /// let leader = locks.holder("scheduler").await?.expect("we lead");
    /// assert_eq!(leader.value, b"10.0.0.7:8080");
    /// # Ok(()) }
    /// ```
    pub async fn holder<N: LockName>(&self, name: N) -> Result<Option<EtcdHolder>, LockError> {
        let name = key::escaped_name(&self.config().delimiter, &name)?;
        let backend = self.backend();
        let queue: Queue =
            super::Layout::of(&backend.lock_prefix(&name), LockMode::Exclusive).blockers;
        let options = queue.top(SortOrder::Ascend);
        let answer = backend
            .members
            .call("reading the lock's holder", |c| {
                let (start, options) = (queue.start.clone(), options.clone());
                async move { c.kv_client().get(start, Some(options)).await }
            })
            .await?;
        Ok(answer.kvs().first().map(|kv| EtcdHolder {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            token: super::token(kv.create_revision()),
        }))
    }
}
