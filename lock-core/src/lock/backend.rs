//! The lock protocol on one Redis deployment (a node or a Cluster): every Redis call
//! the lock engine makes, and nothing of the engine's bookkeeping (holds, leases,
//! renewal schedule, lost signals), which stays in `core`, `acquire`, `watchdog`.
//!
//! A grant is a value (`<client id>:<scope>:<grant number>`) written to the lock's key
//! with the lease as its expiry; every call on a grant compares that value first, so
//! it can only touch its own grant. See `lua/` for the scripts.

use std::sync::Arc;
use std::time::Duration;

use super::Request;
use crate::client::Client;
use crate::client::cleanup::{self, OnDrop};
use crate::client::store::batch::{Entry, Turn as LaneTurn};
use crate::client::store::key::{LockKeys, RELEASED, WAITERS};
use crate::client::store::scripts::{
    ACQUIRE, AcquireReply, Code, FENCE, FenceReply, GrantReply, RELEASE, RENEW, codes,
};
use crate::client::wait::Hub;
use crate::error::LockError;

/// The lock protocol over one client's connection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct RedisBackend {
    client: Client,
}

impl RedisBackend {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// The hub a waiter for a lock listens on (for the lock's release channel).
    pub(crate) fn hub(&self) -> &Hub {
        self.client.hub()
    }

    /// The renewal group of `key`: grants of one group renew in one call.
    pub(crate) fn group(&self, key: &str) -> u16 {
        self.client.conn().group(key)
    }

    /// One attempt to take `req`'s lock with the grant `value`; `linger` (ms): how long
    /// a waiter's marker outlives the holder's lease (0: the caller does not wait).
    ///
    /// Unfenced, a plain `SET NX PX` first, sent at once whatever else is in flight
    /// (concurrent commands share the connection's pipeline; inside a script the same
    /// SET costs Redis several times more). Only what needs the script goes through the
    /// acquire lane (alone, or an entry of the next batched call): a fenced request,
    /// and a lock the SET found busy (the script leaves the waiter marker and reads the
    /// holder's lease). Until the reply is in, the grant may exist: a cancelled or
    /// failed call is given back in the background (the value is this attempt's own).
    pub(crate) async fn take(
        &self,
        req: &Request,
        value: &str,
        linger: u64,
    ) -> Result<AcquireReply, LockError> {
        let keys = &req.keys;
        let undo = || OnDrop::new(|| self.give_back_in_background(keys, value));
        if !req.fenced {
            let undo = undo();
            let granted = self.plain_set(req, value).await?;
            undo.disarm();
            if granted {
                return Ok(AcquireReply::Granted { token: None });
            }
        }
        let entry = || {
            // Queued: a grant its caller will not take (gone), or an unknown outcome (an
            // error), is given back once the reply is in.
            let (backend, k, v) = (self.clone(), keys.clone(), value.to_owned());
            Entry::new()
                .key(&keys.key)
                .key(&keys.fence())
                .key_suffixed(&keys.key, WAITERS)
                .arg(value)
                .arg(req.lease.as_millis() as u64)
                .arg(linger)
                .arg(u8::from(req.fenced))
                .cleanup(move |reply| {
                    let Some(reply) = reply else {
                        return; // never sent
                    };
                    let granted = reply.and_then(AcquireReply::decode);
                    if !matches!(granted, Ok(AcquireReply::Busy { .. })) {
                        backend.give_back_in_background(&k, &v);
                    }
                })
        };
        let (reply, undo) = match self.client.conn().turn(&ACQUIRE, &keys.key, entry) {
            LaneTurn::Alone(alone, entry) => {
                let undo = undo();
                let reply = self.client.conn().send_one(&ACQUIRE, &entry()).await;
                drop(alone);
                (reply?, undo)
            }
            // An error is the queued entry's cleanup's to undo: armed only after.
            LaneTurn::Queued(pending) => (pending.await?, undo()),
        };
        let reply = AcquireReply::decode(reply)?;
        undo.disarm();
        Ok(reply)
    }

    /// `SET key value NX PX lease`, what the raw recipe costs: whether it granted.
    async fn plain_set(&self, req: &Request, value: &str) -> Result<bool, LockError> {
        let mut set = redis::Cmd::with_capacity(6, req.keys.key.len() + value.len() + 24);
        set.arg("SET")
            .arg(&req.keys.key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(req.lease.as_millis() as u64);
        let reply: Option<String> = self.client.conn().query("acquire", &set).await?;
        Ok(reply.is_some())
    }

    /// Deletes the grant `value` of `keys` if the lock still holds it
    /// (compare-and-delete; publishes if someone waits, and wakes this client's
    /// waiters). Used by releases and by the undo of an unfinished acquisition.
    pub(crate) async fn give_back(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<GrantReply, LockError> {
        let reply = self
            .client
            .conn()
            .call(&RELEASE, &keys.key, || {
                Entry::new()
                    .key(&keys.key)
                    .key_suffixed(&keys.key, WAITERS)
                    .key_suffixed(&keys.key, RELEASED)
                    .arg(value)
                    .arg(self.client.id_hex())
            })
            .await?;
        let r = GrantReply::decode("release", reply)?;
        let hub = self.client.hub();
        if r == GrantReply::Done && hub.has_local_waiters() {
            hub.notify_local(&keys.channel());
        }
        Ok(r)
    }

    /// [`give_back`](Self::give_back) for background work, tried again after a failure
    /// ([`cleanup::patiently`]: it deletes only this grant's own value). After a failed
    /// try, `Expired` means that try may have deleted it: reported as done.
    pub(crate) async fn give_back_patiently(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<GrantReply, LockError> {
        match cleanup::patiently("a background delete", || self.give_back(keys, value)).await {
            (Ok(GrantReply::Expired), true) => Ok(GrantReply::Done),
            (answer, _) => answer,
        }
    }

    /// Gives back the grant `value` of `keys` in the background.
    pub(crate) fn give_back_in_background(&self, keys: &Arc<LockKeys>, value: &str) {
        let (backend, keys, value) = (self.clone(), keys.clone(), value.to_owned());
        let name = keys.name.clone();
        cleanup::spawn("undoing an unfinished acquisition", name, async move {
            backend.give_back_patiently(&keys, &value).await.map(|_| ())
        });
    }

    /// The fencing token of the grant `value` of `keys`, taken now if it holds the lock.
    pub(crate) async fn fence(
        &self,
        keys: &LockKeys,
        value: &str,
    ) -> Result<FenceReply, LockError> {
        let conn = self.client.conn();
        let reply = conn
            .eval(&FENCE, conn.timeout(), |c| {
                c.arg(2).arg(&keys.key).arg(keys.fence()).arg(value);
            })
            .await?;
        FenceReply::decode(reply)
    }

    /// Lengthens the lease of the grant `value` of `keys` to `lease` from now (the
    /// script never shortens a lease).
    pub(crate) async fn extend(
        &self,
        keys: &LockKeys,
        value: &str,
        lease: Duration,
    ) -> Result<GrantReply, LockError> {
        let conn = self.client.conn();
        let reply = conn
            .eval(&RENEW, conn.timeout(), |c| {
                c.arg(1)
                    .arg(&keys.key)
                    .arg(value)
                    .arg(lease.as_millis() as u64);
            })
            .await?;
        let code = codes("renew", reply, 1)?[0];
        GrantReply::from_code("renew", code)
    }

    /// Renews many grants (`(keys, value)` each, all of one [`group`](Self::group)) to
    /// `lease` in one call bounded by `within`: one code per grant, in order.
    pub(crate) async fn renew<'a>(
        &self,
        grants: &[(&'a LockKeys, &'a str)],
        lease: Duration,
        within: Duration,
    ) -> Result<Vec<Code>, LockError> {
        let reply = self
            .client
            .conn()
            .eval(&RENEW, within, |c| {
                c.arg(grants.len());
                for (keys, _) in grants {
                    c.arg(&keys.key);
                }
                for (_, value) in grants {
                    c.arg(*value);
                }
                for _ in grants {
                    c.arg(lease.as_millis() as u64);
                }
            })
            .await?;
        codes("renew", reply, grants.len())
    }
}
