//! Read-write locks on Redis: a script (`lua/read_write.lua`) over a hash of holders,
//! beside the plain lock's `SET NX PX`, and two that extend and give holds back
//! (`lua/read_write_extend.lua`, `lua/read_write_release.lua`: they only overwrite or
//! delete, so a full server still runs them).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{RedisBackend, held, renewed};
use crate::client::store::batch::{builder, entry_replies, entry_reply};
use crate::client::store::key::{LockKeys, LockMode, WAITERS};
use crate::client::store::scripts::{
    AcquireReply, GrantReply, READ_WRITE, READ_WRITE_EXTEND, READ_WRITE_RELEASE, code_value,
};
use crate::error::LockError;
use crate::lock::Request;
use crate::lock::registry::Loss;
use crate::lock::seam::{Held, Renewed};

impl RedisBackend {
    /// One attempt at a read or write hold, as the grant `value` (see
    /// [`take_in_lane`](RedisBackend::take_in_lane)).
    pub(super) async fn take_shared(
        &self,
        req: &Request,
        value: &Arc<str>,
        wait: Duration,
    ) -> Result<AcquireReply, LockError> {
        let keys = &req.keys;
        let write = keys.mode == LockMode::Write;
        // A waiting writer marks the lock for as long as it still waits, at most one
        // linger (it asks again within that); a reader leaves no mark.
        let linger = if write {
            wait.min(self.client.config().waiter_linger()).as_millis() as u64
        } else {
            0
        };
        let entry = builder(|e| {
            let e = e.key(&keys.key).key_suffixed(&keys.key, WAITERS);
            // Only a writer takes a token: the others name the lock again.
            let e = if write {
                e.key(&keys.fence())
            } else {
                e.key(&keys.key)
            };
            e.arg(if write { "w" } else { "r" })
                .arg(&**value)
                .arg(req.lease.as_millis() as u64)
                .arg(linger)
        });
        self.take_in_lane(&READ_WRITE, keys, value, entry).await
    }

    /// Gives back a read or write hold, alone or an entry of the next batched call.
    pub(super) async fn give_back_shared(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<Held, LockError> {
        let kind = match keys.mode {
            LockMode::Write => "w",
            _ => "r",
        };
        let reply = self
            .client
            .conn()
            .call(&READ_WRITE_RELEASE, &keys.key, |e| {
                e.key(&keys.key)
                    .arg(kind)
                    .arg(value)
                    .arg(self.client.id_hex())
            })
            .await?;
        let reply = GrantReply::decode("read_write_release", reply)?;
        self.wake_local_waiters(keys);
        Ok(held(reply))
    }

    /// Extends read-write holds in one call of the script, one entry each, within
    /// `within` (the watchdog's time limit), sent at `sent`: an answer per hold, in
    /// order, or that entry's error. A key of another type answers not owner, as a
    /// plain grant's renewal does.
    async fn extend_shared(
        &self,
        holds: &[(&LockKeys, &Arc<str>)],
        lease: Duration,
        within: Duration,
        sent: Instant,
    ) -> Result<Vec<Renewed>, LockError> {
        let reply = self
            .client
            .conn()
            .eval(&READ_WRITE_EXTEND, within, |c| {
                c.arg(holds.len());
                for (keys, _) in holds {
                    c.arg(&keys.key);
                }
                for (_, value) in holds {
                    c.arg(&***value).arg(lease.as_millis() as u64);
                }
            })
            .await?;
        let codes = entry_replies(&READ_WRITE_EXTEND, reply, holds.len())?
            .into_iter()
            .map(|r| Ok(code_value("read_write_extend", entry_reply(r)?)?.0));
        Ok(renewed("read_write_extend", codes, sent, lease))
    }

    /// Renews plain grants in one call and read-write holds in another, at once.
    pub(super) async fn renew_mixed(
        &self,
        grants: &[(&LockKeys, &Arc<str>)],
        lease: Duration,
        within: Duration,
    ) -> Result<Vec<Renewed>, LockError> {
        let (shared, plain): (Vec<_>, Vec<_>) = grants
            .iter()
            .partition(|(keys, _)| keys.mode.is_read_write());
        let sent = Instant::now();
        let plain_renewal = async {
            if plain.is_empty() {
                return Ok(Vec::new());
            }
            self.renew_plain(&plain, lease, within, sent).await
        };
        let shared_renewal = async {
            if shared.is_empty() {
                return Ok(Vec::new());
            }
            self.extend_shared(&shared, lease, within, sent).await
        };
        let (plain_held, shared_held) = tokio::join!(plain_renewal, shared_renewal);
        let mut plain_held = plain_held?.into_iter();
        let mut shared_held = shared_held?.into_iter();
        Ok(grants
            .iter()
            .map(|(keys, _)| {
                let answer = if keys.mode.is_read_write() {
                    shared_held.next()
                } else {
                    plain_held.next()
                };
                answer.unwrap_or(Ok(Err(Loss::Expired)))
            })
            .collect())
    }
}
