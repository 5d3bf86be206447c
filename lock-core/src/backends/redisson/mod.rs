//! Locks in Redisson's layout on one Redis deployment (a node or a Cluster), behind the
//! engine's seam: a Java service on Redisson's `RLock`, `RFairLock` or
//! `RReadWriteLock` and a Rust service on [`RedissonLocks`](crate::RedissonLocks)
//! exclude each other and wake each other's waiters.
//!
//! A hold is a field of the lock's hash, `<client uuid>:<thread id>`, as Redisson
//! writes it: the client id as a UUID, the scope as the thread. The engine counts
//! re-entries in the client, so a grant of this crate is one hold of its field; a Java
//! thread's re-entries count in the hash. Scripts: `lua/redisson_lock.lua` (plain and
//! fair) and `lua/redisson_read_write.lua`; keys and channels: `layout.rs`.

mod layout;

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use crate::backends::redis::{fenced, held, taken};
use crate::client::Client;
use crate::client::cleanup::{self, OnDrop};
use crate::client::config::{LockConfig, proven};
use crate::client::store::Args;
use crate::client::store::key::{LockKeys, LockMode};
use crate::client::store::scripts::{
    AcquireReply, Code, FenceReply, GrantReply, REDISSON_LOCK, REDISSON_READ_WRITE, code_value,
};
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::lock::Request;
use crate::lock::seam::{Backend, Capabilities, Held, Seam, Taken};
use crate::metrics::StoreKind;
use crate::owner::{FencingToken, LockScope, push_decimal, push_hex};

/// How long a fair waiter's place outlives the place before it, by default: Redisson's
/// `threadWaitTime` (5 minutes).
pub const DEFAULT_FAIR_WAIT: Duration = Duration::from_secs(300);

/// Locks in Redisson's layout: the backend of [`RedissonLocks`](crate::RedissonLocks).
#[derive(Clone)]
pub struct RedissonBackend {
    client: Client,
    /// The client id as Redisson writes one: a UUID.
    uuid: Arc<str>,
    fair_wait: Duration,
}

impl std::fmt::Debug for RedissonBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedissonBackend")
            .field("uuid", &self.uuid)
            .field("fair_wait", &self.fair_wait)
            .finish_non_exhaustive()
    }
}

impl Backend for RedissonBackend {}

/// One grant: the hold's field, the request id naming this grant (its unlock latch and
/// its evidence), and which script holds it.
#[derive(Clone, Debug)]
pub(crate) struct RedissonGrant {
    field: Arc<str>,
    request: Arc<str>,
    fair: bool,
}

impl RedissonBackend {
    /// Redisson's layout on `client`'s deployment, with the default fair wait.
    pub(crate) fn new(client: Client) -> Self {
        let uuid = layout::uuid(client.id_hex()).into();
        Self {
            client,
            uuid,
            fair_wait: DEFAULT_FAIR_WAIT,
        }
    }

    pub(crate) fn fair_wait(&self) -> Duration {
        self.fair_wait
    }

    pub(crate) fn with_fair_wait(&self, fair_wait: Duration) -> Self {
        Self {
            fair_wait,
            ..self.clone()
        }
    }

    /// The hold field of `scope` in `mode`: `<uuid>:<thread id>` (the script adds a
    /// writer's `:write`).
    fn field(&self, scope: &LockScope) -> String {
        let mut field = String::with_capacity(self.uuid.len() + 21);
        field.push_str(&self.uuid);
        field.push(':');
        push_decimal(&mut field, scope.id());
        field
    }

    /// One call of the script for `keys`' kind of lock: `action` on `grant`'s field.
    async fn call(
        &self,
        keys: &LockKeys,
        grant: &RedissonGrant,
        action: &str,
        args: impl Fn(&mut Args),
    ) -> Result<Value, LockError> {
        let name = keys.name();
        let conn = self.client.conn();
        let latch = layout::per_request(layout::UNLOCK_LATCH, name, &grant.request);
        let evidence = layout::per_request(layout::GRANT, name, &grant.request);
        let token = layout::prefixed(layout::TOKEN, name);
        if keys.mode.is_read_write() {
            let read = keys.mode == LockMode::Read;
            let mine = layout::suffixed(name, &format!("{}:rwlock_timeout", grant.field));
            conn.eval(&REDISSON_READ_WRITE, conn.timeout(), |c| {
                c.arg(6)
                    .arg(name)
                    .arg(&latch)
                    .arg(&evidence)
                    .arg(&token)
                    .arg(&mine)
                    .arg(layout::tagged(name))
                    .arg(action)
                    .arg(if read { "r" } else { "w" })
                    .arg(&*grant.field)
                    .arg(layout::prefixed(layout::READ_WRITE_CHANNEL, name));
                args(c);
            })
            .await
        } else {
            conn.eval(&REDISSON_LOCK, conn.timeout(), |c| {
                c.arg(6)
                    .arg(name)
                    .arg(&latch)
                    .arg(&evidence)
                    .arg(&token)
                    .arg(layout::prefixed(layout::QUEUE, name))
                    .arg(layout::prefixed(layout::TIMEOUT, name))
                    .arg(action)
                    .arg(&*grant.field)
                    .arg(layout::prefixed(layout::LOCK_CHANNEL, name))
                    .arg(if grant.fair { "fair" } else { "plain" });
                args(c);
            })
            .await
        }
    }

    /// How long an unlock's answer is kept for a retry of it.
    fn latch_ms(&self) -> u64 {
        (self.client.conn().timeout() * 4).as_millis() as u64
    }

    /// Gives back one hold of `grant`: `undo` only if that grant was taken (a reply
    /// lost on the way).
    async fn unlock(
        &self,
        keys: &LockKeys,
        grant: &RedissonGrant,
        undo: bool,
    ) -> Result<Held, LockError> {
        let action = if undo { "undo" } else { "release" };
        let reply = self
            .call(keys, grant, action, |c| {
                c.arg(self.latch_ms());
            })
            .await?;
        let held = held(GrantReply::decode("redisson", reply)?);
        if held.is_ok() && !grant.fair {
            // This client's own waiters need no message.
            let hub = self.client.hub();
            if hub.has_local_waiters() {
                hub.notify_local(&self.listen_channel(keys, None));
            }
        }
        Ok(held)
    }

    /// Undoes, in the background, an acquisition of `grant` whose reply never came.
    fn undo_in_background(&self, keys: &LockKeys, grant: &RedissonGrant) {
        let (backend, keys, grant) = (self.clone(), keys.clone(), grant.clone());
        let name = keys.name().to_owned();
        cleanup::spawn("undoing an unfinished acquisition", name, async move {
            let call = || backend.unlock(&keys, &grant, true);
            cleanup::patiently("an undo", call).await.0.map(|_| ())
        });
    }

    /// Where a waiter for `keys` listens: a fair waiter (`fair_field`, its field) on a
    /// channel of its own.
    fn listen_channel(&self, keys: &LockKeys, fair_field: Option<&str>) -> String {
        if keys.mode.is_read_write() {
            return layout::prefixed(layout::READ_WRITE_CHANNEL, keys.name());
        }
        let mut channel = layout::prefixed(layout::LOCK_CHANNEL, keys.name());
        if let Some(field) = fair_field {
            channel.push(':');
            channel.push_str(field);
        }
        channel
    }

    fn request_grant(&self, req: &Request, seq: u64) -> RedissonGrant {
        let field = self.field(&req.scope);
        let mut request = String::with_capacity(field.len() + 17);
        request.push_str(&field);
        request.push(':');
        push_hex(&mut request, seq);
        RedissonGrant {
            field: field.into(),
            request: request.into(),
            fair: req.fair && !req.keys.mode.is_read_write(),
        }
    }
}

impl Seam for RedissonBackend {
    type Grant = RedissonGrant;

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
    ) -> Result<Taken<RedissonGrant>, LockError> {
        let grant = self.request_grant(req, seq);
        let fenced = u8::from(req.fenced);
        let sent = Instant::now();
        let waits = u8::from(grant.fair && deadline > sent);
        // Until the reply is in, the grant may exist: undone in the background.
        let undo = OnDrop::new(|| self.undo_in_background(&req.keys, &grant));
        let reply = self
            .call(&req.keys, &grant, "acquire", |c| {
                c.arg(req.lease.as_millis() as u64)
                    .arg(fenced)
                    .arg(self.fair_wait.as_millis() as u64)
                    .arg(waits);
            })
            .await?;
        undo.disarm();
        Ok(taken(
            AcquireReply::decode(reply)?,
            grant,
            &self.client,
            seq,
            sent,
            req.lease,
        ))
    }

    async fn give_back(&self, keys: &LockKeys, grant: &RedissonGrant) -> Result<Held, LockError> {
        self.unlock(keys, grant, false).await
    }

    async fn extend(
        &self,
        keys: &LockKeys,
        grant: &RedissonGrant,
        lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        let sent = Instant::now();
        let reply = self
            .call(keys, grant, "renew", |c| {
                c.arg(lease.as_millis() as u64);
            })
            .await?;
        Ok(held(GrantReply::decode("redisson", reply)?).map(|()| proven(sent, lease)))
    }

    async fn fence(
        &self,
        keys: &LockKeys,
        grant: &RedissonGrant,
        seq: u64,
    ) -> Result<Held<FencingToken>, LockError> {
        let reply = self.call(keys, grant, "fence", |_| {}).await?;
        Ok(fenced(FenceReply::decode(reply)?, &self.client, seq))
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, channel: &'a str) -> Option<Listen<'a>> {
        Some(Listen::Hub(self.client.hub(), channel))
    }

    fn channel(&self, req: &Request) -> String {
        let field = req.fair.then(|| self.field(&req.scope));
        self.listen_channel(&req.keys, field.as_deref())
    }

    async fn leave(&self, req: &Request) -> Result<(), LockError> {
        let grant = self.request_grant(req, 0);
        let reply = self
            .call(&req.keys, &grant, "leave", |c| {
                c.arg(self.fair_wait.as_millis() as u64);
            })
            .await?;
        match code_value("redisson", reply)? {
            (Code::Done, _) => Ok(()),
            (code, _) => Err(LockError::UnexpectedReply(format!(
                "redisson_lock.lua leave answered {code:?}"
            ))),
        }
    }
}

impl crate::lock::LockGuard<RedissonBackend> {
    /// The field this guard's hold is in the lock's hash, as Redisson writes one:
    /// `<client uuid>:<thread id>` (the scope's number as the thread id; a writer's
    /// field in the hash adds `:write`).
    pub fn field(&self) -> &str {
        &self.record().field
    }
}
