//! The lock protocol on one Redis deployment (a node or a Cluster): every Redis call
//! the lock engine makes, behind the engine's seam ([`Seam`]), and nothing of the
//! engine's bookkeeping (holds, leases, renewal schedule, lost signals).
//!
//! A grant is a value (`<client id>:<scope>:<grant number>`) written to the lock's key
//! with the lease as its expiry; every call on a grant compares that value first, so
//! it can only touch its own grant. See `lua/` for the scripts. Read-write locks are in
//! `shared.rs`, the line of a fair lock in `fair.rs`.

mod fair;
mod shared;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::client::Client;
use crate::client::cleanup::{self, OnDrop};
use crate::client::config::{LockConfig, proven};
use crate::client::store::batch::{Entry, Turn as LaneTurn, builder};
use crate::client::store::key::{LockKeys, LockMode, QUEUE, WAITERS};
use crate::client::store::scripts::{
    ACQUIRE, AcquireReply, Code, FENCE, FenceReply, GrantReply, Lua, RELEASE, RENEW, codes,
};
use crate::client::store::{Args, refused};
use crate::client::wait::{Listen, pttl_hint};
use crate::error::LockError;
use crate::lock::Request;
use crate::lock::registry::Loss;
use crate::lock::seam::{
    Backend, Capabilities, Held, Renewed, Seam, Taken, Validity, give_back_patiently,
};
use crate::metrics::StoreKind;
use crate::owner::{FencingToken, LockScope, push_hex};

/// Locks on one Redis node or a Redis Cluster: the backend of
/// [`LockClient`](crate::LockClient), whose guards are [`LockGuard`](crate::LockGuard)
/// (`LockGuard<RedisBackend>`).
///
/// A grant is a value (`<client id>:<scope>:<grant number>`) written to the lock's key
/// with the lease as its expiry; see the crate's `lua/` for the scripts.
#[derive(Clone)]
pub struct RedisBackend {
    client: Client,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("client", &self.client.id())
            .finish_non_exhaustive()
    }
}

impl Backend for RedisBackend {}

/// The owner id (client id and scope) inside a grant value that
/// `RedisBackend::grant_value` wrote: all of it before the last `:`.
pub(crate) fn owner_of(value: &str) -> &str {
    value.rsplit_once(':').map_or(value, |(owner, _)| owner)
}

impl RedisBackend {
    pub(crate) fn new(client: Client) -> Self {
        Self { client }
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// A value for a new grant: unique per grant (this client's random id, the scope and
    /// the engine's grant number), so a release or renewal can only touch its own grant.
    /// Shared, not copied: an undo in the background holds it beside the grant.
    fn grant_value(&self, scope: &LockScope, seq: u64) -> Arc<str> {
        thread_local! {
            // Built here, then copied once into its own allocation.
            static VALUE: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
        }
        let id = self.client.id_hex();
        let build = |value: &mut String| {
            value.clear();
            // `<owner>:<grant number>`: the owner id is recovered from it by `owner_of`.
            scope.write_owner(id, value);
            value.push(':');
            push_hex(value, seq);
            Arc::from(value.as_str())
        };
        // A thread whose locals are gone (or a buffer in use) builds in a fresh one.
        VALUE
            .try_with(|v| v.try_borrow_mut().ok().map(|mut v| build(&mut v)))
            .ok()
            .flatten()
            .unwrap_or_else(|| build(&mut String::new()))
    }

    /// One attempt to take `req`'s lock with the grant `value`; `linger` (ms): how long
    /// a waiter's marker outlives the holder's lease (0: the caller does not wait).
    ///
    /// Unfenced, a plain `SET NX PX` first (inside a script the same SET costs Redis
    /// several times more), alone or in the next pipeline of plain commands. Only what
    /// needs the script goes through the acquire lane (alone, or an entry of the next
    /// batched call): a fenced request, and a lock the SET found busy (the script leaves
    /// the waiter marker and reads the holder's lease). Until the reply is in, the grant
    /// may exist: a cancelled or failed call is given back in the background (the value
    /// is this attempt's own).
    async fn take_value(
        &self,
        req: &Request,
        value: &Arc<str>,
        linger: u64,
    ) -> Result<AcquireReply, LockError> {
        if !req.fenced && self.plain_set(req, value).await? {
            return Ok(AcquireReply::Granted { token: None });
        }
        // Boxed: every acquisition's future stays the size of the SET's.
        Box::pin(self.take_by_acquire(req, value, linger)).await
    }

    /// The acquire script's part of [`take_value`](Self::take_value).
    async fn take_by_acquire(
        &self,
        req: &Request,
        value: &Arc<str>,
        linger: u64,
    ) -> Result<AcquireReply, LockError> {
        let keys = &req.keys;
        let entry = builder(|e| {
            e.key(&keys.key)
                .key(&keys.fence())
                .key_suffixed(&keys.key, WAITERS)
                .arg(&**value)
                .arg(req.lease.as_millis() as u64)
                .arg(linger)
                .arg(u8::from(req.fenced))
        });
        self.take_in_lane(&ACQUIRE, keys, value, entry).await
    }

    /// One acquisition of `value` as the entry `entry` builds, of a `script` that
    /// answers like the acquire script: alone, or an entry of the lane's next batched
    /// call. Until the reply is in, the grant may exist: a cancelled or failed call is
    /// given back in the background.
    pub(super) async fn take_in_lane(
        &self,
        script: &'static Lua,
        keys: &Arc<LockKeys>,
        value: &Arc<str>,
        entry: impl FnOnce(Entry<'_>) -> Entry<'_>,
    ) -> Result<AcquireReply, LockError> {
        let undo = || OnDrop::new(|| self.give_back_in_background(keys, value));
        let conn = self.client.conn();
        let (reply, undo) = match conn.turn(script, &keys.key, entry) {
            LaneTurn::Alone(alone, entry) => {
                let undo = undo();
                let reply = conn.send_one(script, entry).await;
                drop(alone);
                (reply?, undo)
            }
            // Queued, what the call leaves is undone once its outcome is known (an
            // error, or this future gone): the undo below is armed only after.
            LaneTurn::Queued(pending) => {
                let reply = pending
                    .or_undo(|| {
                        self.undo_unless(keys, value, |r| {
                            let reply = r.as_ref().map(|v| AcquireReply::decode(v.clone()));
                            matches!(reply, Ok(Ok(AcquireReply::Busy { .. })))
                        })
                    })
                    .await?;
                (reply, undo())
            }
        };
        let reply = AcquireReply::decode(reply)?;
        undo.disarm();
        Ok(reply)
    }

    /// The answer of an acquire script `call` that may grant `value` of `keys`: until
    /// the reply is in, the grant may exist, so a cancelled or failed call is given
    /// back in the background.
    async fn take_by_script(
        &self,
        keys: &Arc<LockKeys>,
        value: &Arc<str>,
        call: impl Future<Output = Result<Value, LockError>>,
    ) -> Result<AcquireReply, LockError> {
        let undo = OnDrop::new(|| self.give_back_in_background(keys, value));
        let reply = call.await?;
        undo.disarm();
        AcquireReply::decode(reply)
    }

    /// `SET key value NX PX lease`, what the raw recipe costs: whether it granted.
    async fn plain_set(&self, req: &Request, value: &Arc<str>) -> Result<bool, LockError> {
        let set = |mut set: Args| {
            set.arg("SET")
                .arg(&req.keys.key)
                .arg(&**value)
                .arg("NX")
                .arg("PX")
                .arg(req.lease.as_millis() as u64);
            set
        };
        let conn = self.client.conn();
        let reply = match conn.turn_command("acquire", &req.keys.key, set) {
            LaneTurn::Alone(alone, set) => {
                let undo = OnDrop::new(|| self.give_back_in_background(&req.keys, value));
                let buf = Args::with_capacity(6, req.keys.key.len() + value.len() + 24);
                let reply = conn.query::<Value>("acquire", &set(buf)).await;
                drop(alone);
                // Answered: the caller takes it from here (a refusal set nothing).
                if reply.is_ok() || not_set(&reply) {
                    undo.disarm();
                }
                reply?
            }
            // An error, or a reply this future is gone for, is the undo's to undo.
            LaneTurn::Queued(pending) => {
                pending
                    .or_undo(|| self.undo_unless(&req.keys, value, not_set))
                    .await?
            }
        };
        match reply {
            Value::Nil => Ok(false),
            Value::Okay => Ok(true),
            other => Err(LockError::UnexpectedReply(format!(
                "acquire: SET NX answered {other:?}"
            ))),
        }
    }

    /// The cleanup of a queued call that may take the grant `value`: once the outcome
    /// is known and its caller will not act on it, the grant is given back unless the
    /// reply proves it was not taken (`not_taken`).
    fn undo_unless(
        &self,
        keys: &Arc<LockKeys>,
        value: &Arc<str>,
        not_taken: impl FnOnce(&Result<Value, LockError>) -> bool + Send + Sync + 'static,
    ) -> impl FnOnce(Option<Result<Value, LockError>>) + Send + Sync + 'static {
        let (backend, k, v) = (self.clone(), keys.clone(), value.clone());
        move |reply| {
            let Some(reply) = reply else {
                return; // never sent
            };
            if !not_taken(&reply) {
                backend.give_back_in_background(&k, &v);
            }
        }
    }

    /// Deletes the grant `value` of `keys` if the lock still holds it
    /// (compare-and-delete; publishes if someone waits, and wakes this client's
    /// waiters). Used by releases and by the undo of an unfinished acquisition.
    async fn give_back_value(&self, keys: &LockKeys, value: &str) -> Result<GrantReply, LockError> {
        let reply = self
            .client
            .conn()
            .call(&RELEASE, &keys.key, |e| {
                e.key(&keys.key)
                    .key_suffixed(&keys.key, WAITERS)
                    .key_suffixed(&keys.key, QUEUE)
                    .arg(value)
            })
            .await?;
        let r = GrantReply::decode("release", reply)?;
        if r == GrantReply::Done {
            self.wake_local_waiters(keys);
        }
        Ok(r)
    }

    /// How long (ms) a waiter's mark or place outlives what it waits for: the longest
    /// sleep between two attempts and one call, so a waiter is marked while it waits;
    /// 0 for a caller that does not wait.
    fn linger_ms(&self, waits: bool) -> u64 {
        if waits {
            self.client.config().waiter_linger().as_millis() as u64
        } else {
            0
        }
    }

    /// Wakes this client's waiters for `keys` at once, without the pub/sub round trip.
    fn wake_local_waiters(&self, keys: &LockKeys) {
        let hub = self.client.hub();
        if hub.has_local_waiters() {
            hub.notify_local(&keys.channel());
        }
    }

    /// Gives back the grant `value` of `keys` in the background.
    fn give_back_in_background(&self, keys: &Arc<LockKeys>, value: &Arc<str>) {
        let (backend, keys, value) = (self.clone(), keys.clone(), value.clone());
        let name = keys.name().to_owned();
        cleanup::spawn("undoing an unfinished acquisition", name, async move {
            give_back_patiently(&backend, &keys, &value)
                .await
                .map(|_| ())
        });
    }

    /// The fencing token of the grant `value` of `keys`, taken now if it holds the lock.
    async fn fence_value(&self, keys: &LockKeys, value: &str) -> Result<FenceReply, LockError> {
        let conn = self.client.conn();
        let reply = conn
            .eval(&FENCE, conn.timeout(), |c| {
                c.arg(2).arg(&keys.key).arg(keys.fence()).arg(value);
                if keys.mode == LockMode::Write {
                    c.arg("w");
                }
            })
            .await?;
        FenceReply::decode(reply)
    }
}

/// Whether a `SET NX` reply proves the key was not set: the key existed (nil), or
/// the server refused the command (an error reply: it did not run).
fn not_set(reply: &Result<Value, LockError>) -> bool {
    matches!(reply, Ok(Value::Nil)) || refused(reply)
}

/// A lock script's answer on one grant, as the engine reads it (this crate's scripts
/// and Redisson's layout answer alike).
pub(crate) fn held(reply: GrantReply) -> Held {
    match reply {
        GrantReply::Done => Ok(()),
        GrantReply::Expired => Err(Loss::Expired),
        GrantReply::NotOwner => Err(Loss::TakenOver),
    }
}

/// An acquire script's answer, as the engine reads it: `grant` (grant `seq` of `client`,
/// asked for at `sent` with `lease`) taken, or the lock busy.
pub(crate) fn taken<G>(
    reply: AcquireReply,
    grant: G,
    client: &Client,
    seq: u64,
    sent: Instant,
    lease: Duration,
) -> Taken<G> {
    match reply {
        AcquireReply::Granted { token } => Taken::Granted {
            grant,
            token: token.map(|t| client.id().grant_token(seq, t)),
            valid: Validity::Until(proven(sent, lease)),
        },
        AcquireReply::Busy { pttl_ms } => Taken::Busy {
            retry_after: pttl_hint(pttl_ms, client.config().backoff.max),
            failure: None,
        },
    }
}

/// A fence script's answer, as the engine reads it: a token of grant `seq` of `client`.
pub(crate) fn fenced(reply: FenceReply, client: &Client, seq: u64) -> Held<FencingToken> {
    match reply {
        FenceReply::Token(t) => Ok(client.id().grant_token(seq, t)),
        FenceReply::Lost(reply) => Err(held(reply).err().unwrap_or(Loss::Expired)),
    }
}

impl Seam for RedisBackend {
    type Grant = Arc<str>;

    fn kind(&self) -> StoreKind {
        self.client.kind()
    }

    fn config(&self) -> &LockConfig {
        self.client.config()
    }

    const CAPABILITIES: Capabilities = Capabilities::RENEWED_LEASES.with_shared(true);

    async fn take(
        &self,
        req: &Request,
        seq: u64,
        deadline: Instant,
    ) -> Result<Taken<Arc<str>>, LockError> {
        let value = self.grant_value(&req.scope, seq);
        let sent = Instant::now();
        let wait = || deadline.saturating_duration_since(sent);
        // The plain lock's future stays small: the others' larger ones are boxed.
        let reply = if req.keys.mode.is_read_write() {
            Box::pin(self.take_shared(req, &value, wait())).await?
        } else if req.fair {
            Box::pin(self.take_fair(req, &value, wait())).await?
        } else {
            self.take_value(req, &value, self.linger_ms(deadline > sent))
                .await?
        };
        Ok(taken(reply, value, &self.client, seq, sent, req.lease))
    }

    async fn give_back(&self, keys: &LockKeys, grant: &Arc<str>) -> Result<Held, LockError> {
        if keys.mode.is_read_write() {
            return Box::pin(self.give_back_shared(keys, grant)).await;
        }
        self.give_back_value(keys, grant).await.map(held)
    }

    async fn extend(
        &self,
        keys: &LockKeys,
        grant: &Arc<str>,
        lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        let within = self.client.conn().timeout();
        self.renew(&[(keys, grant)], lease, within)
            .await?
            .pop()
            .ok_or_else(|| LockError::UnexpectedReply("renew.lua answered nothing".into()))?
    }

    async fn renew(
        &self,
        grants: &[(&LockKeys, &Arc<str>)],
        lease: Duration,
        within: Duration,
    ) -> Result<Vec<Renewed>, LockError> {
        if grants.iter().any(|(keys, _)| keys.mode.is_read_write()) {
            return self.renew_mixed(grants, lease, within).await;
        }
        self.renew_plain(grants, lease, within, Instant::now())
            .await
    }

    fn group(&self, key: &str) -> u16 {
        self.client.conn().group(key)
    }

    async fn fence(
        &self,
        keys: &LockKeys,
        grant: &Arc<str>,
        seq: u64,
    ) -> Result<Held<FencingToken>, LockError> {
        // A plain lock's token on demand, or a write hold's (which came with its
        // grant) once its lease is no longer known to hold: the script checks the hold.
        Ok(fenced(
            self.fence_value(keys, grant).await?,
            &self.client,
            seq,
        ))
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, channel: &'a str) -> Option<Listen<'a>> {
        Some(Listen::Hub(self.client.hub(), channel))
    }

    fn channel(&self, req: &Request) -> String {
        if req.fair {
            self.fair_channel(req)
        } else {
            req.keys.channel()
        }
    }

    async fn leave(&self, req: &Request) -> Result<(), LockError> {
        self.leave_fair(req).await
    }
}

impl RedisBackend {
    /// Renews the plain grants `(keys, value)` (all of one [`group`](Seam::group)) to
    /// `lease` in one call bounded by `within`, sent at `sent`: one answer per grant,
    /// in order.
    pub(super) async fn renew_plain(
        &self,
        grants: &[(&LockKeys, &Arc<str>)],
        lease: Duration,
        within: Duration,
        sent: Instant,
    ) -> Result<Vec<Renewed>, LockError> {
        let reply = self
            .client
            .conn()
            .eval(&RENEW, within, |c| {
                c.arg(grants.len());
                for (keys, _) in grants {
                    c.arg(&keys.key);
                }
                for (_, value) in grants {
                    c.arg(&***value);
                }
                for _ in grants {
                    c.arg(lease.as_millis() as u64);
                }
            })
            .await?;
        let codes = codes("renew", reply, grants.len())?;
        Ok(renewed("renew", codes.into_iter().map(Ok), sent, lease))
    }
}

/// A renewal script's (`op`'s) `codes`, one per entry, as the engine reads them: each
/// renewed grant is proven for `lease` from `sent`.
fn renewed(
    op: &str,
    codes: impl IntoIterator<Item = Result<Code, LockError>>,
    sent: Instant,
    lease: Duration,
) -> Vec<Renewed> {
    codes
        .into_iter()
        .map(|code| Ok(held(GrantReply::from_code(op, code?)?).map(|()| proven(sent, lease))))
        .collect()
}
