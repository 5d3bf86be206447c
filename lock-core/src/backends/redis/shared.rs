//! Read-write locks on Redis: one script (`lua/read_write.lua`) over a hash of holders,
//! beside the plain lock's `SET NX PX`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{RedisBackend, held, renewed};
use crate::client::config::proven;
use crate::client::store::batch::Entry;
use crate::client::store::key::{LockKeys, LockMode, WAITERS};
use crate::client::store::scripts::{AcquireReply, GrantReply, READ_WRITE};
use crate::error::LockError;
use crate::lock::Request;
use crate::lock::registry::Loss;
use crate::lock::seam::Held;

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
        let entry = |e: Entry| {
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
        };
        self.take_in_lane(&READ_WRITE, keys, value, entry).await
    }

    /// Gives back a read or write hold, alone or an entry of the next batched call.
    pub(super) async fn give_back_shared(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<Held, LockError> {
        let op = match keys.mode {
            LockMode::Write => "release-w",
            _ => "release-r",
        };
        let reply = self
            .client
            .conn()
            .call(&READ_WRITE, &keys.key, |e| {
                e.key(&keys.key)
                    .key(&keys.key)
                    .key(&keys.key)
                    .arg(op)
                    .arg(value)
                    .arg(self.client.id_hex())
                    .arg(0)
            })
            .await?;
        let reply = GrantReply::decode("read_write", reply)?;
        self.wake_local_waiters(keys);
        Ok(held(reply))
    }

    /// Extends one hold within `within` (a call of its own: the watchdog's time limit).
    pub(super) async fn extend_shared(
        &self,
        keys: &LockKeys,
        value: &str,
        lease: Duration,
        within: Duration,
    ) -> Result<Held<Instant>, LockError> {
        let sent = Instant::now();
        let reply = self
            .client
            .conn()
            .eval(&READ_WRITE, within, |c| {
                c.arg(3)
                    .arg(&keys.key)
                    .arg(&keys.key)
                    .arg(&keys.key)
                    .arg("extend")
                    .arg(value)
                    .arg(lease.as_millis() as u64)
                    .arg(0);
            })
            .await?;
        Ok(held(GrantReply::decode("read_write", reply)?).map(|()| proven(sent, lease)))
    }

    /// Renews plain grants in one call, and read-write holds one call each, at once.
    pub(super) async fn renew_mixed(
        &self,
        grants: &[(&LockKeys, &Arc<str>)],
        lease: Duration,
        within: Duration,
    ) -> Result<Vec<Held<Instant>>, LockError> {
        let (shared, plain): (Vec<_>, Vec<_>) = grants
            .iter()
            .partition(|(keys, _)| keys.mode.is_read_write());
        let sent = Instant::now();
        let plain_renewal = async {
            if plain.is_empty() {
                return Ok(Vec::new());
            }
            renewed(self.renew_values(&plain, lease, within).await?, sent, lease)
        };
        let shared_renewals = futures_util::future::join_all(
            shared
                .iter()
                .map(|(keys, value)| self.extend_shared(keys, value, lease, within)),
        );
        let (plain_held, shared_held) = tokio::join!(plain_renewal, shared_renewals);
        let mut plain_held = plain_held?.into_iter();
        let mut shared_held = shared_held.into_iter();
        grants
            .iter()
            .map(|(keys, _)| {
                if keys.mode.is_read_write() {
                    shared_held.next().unwrap_or(Ok(Err(Loss::Expired)))
                } else {
                    Ok(plain_held.next().unwrap_or(Err(Loss::Expired)))
                }
            })
            .collect()
    }
}
