//! The line of a fair lock on Redis (`lua/fair.lua`, left by `lua/fair_leave.lua`): the
//! plain lock's key, granted to the waiters of a list (`<key>:queue`) in order, each
//! place kept by a deadline in a sorted set (`<key>:timeouts`) that each attempt pushes
//! back by one place lease.
//!
//! A waiter is its owner (client id and scope: the same for every attempt of one
//! acquisition, as Redisson's `<uuid>:<threadId>`), and listens on its own channel
//! (`<key>:released:<owner>`): a release wakes the head of the line, not the herd.

use std::sync::Arc;
use std::time::Duration;

use super::RedisBackend;
use crate::client::store::key::{QUEUE, RELEASED, TIMEOUTS, WAITERS, suffixed};
use crate::client::store::scripts::{AcquireReply, Code, FAIR, FAIR_LEAVE, code_value};
use crate::error::LockError;
use crate::lock::Request;

impl RedisBackend {
    /// The owner of `req`'s waiter in a line: `<client id>:<scope>`.
    fn owner(&self, req: &Request) -> String {
        let mut owner = String::with_capacity(64);
        req.scope.write_owner(self.client.id_hex(), &mut owner);
        owner
    }

    /// The channel where `req`'s waiter is woken once it heads the line.
    pub(super) fn fair_channel(&self, req: &Request) -> String {
        let owner = self.owner(req);
        let key = &req.keys.key;
        let mut channel = String::with_capacity(key.len() + RELEASED.len() + 1 + owner.len());
        channel.push_str(key);
        channel.push_str(RELEASED);
        channel.push(':');
        channel.push_str(&owner);
        channel
    }

    /// One attempt in the line, as the grant `value`: granted if the lock is free and
    /// nobody queues before this waiter; otherwise its place is taken or kept (`wait`
    /// zero: none is taken).
    pub(super) async fn take_fair(
        &self,
        req: &Request,
        value: &Arc<str>,
        wait: Duration,
    ) -> Result<AcquireReply, LockError> {
        let place = self.linger_ms(!wait.is_zero());
        let owner = self.owner(req);
        let keys = &req.keys;
        let conn = self.client.conn();
        let call = conn.eval(&FAIR, conn.timeout(), |c| {
            c.arg(5)
                .arg(&keys.key)
                .arg(suffixed(&keys.key, QUEUE))
                .arg(suffixed(&keys.key, TIMEOUTS))
                .arg(suffixed(&keys.key, WAITERS))
                .arg(keys.fence())
                .arg(&owner)
                .arg(suffixed(&keys.key, RELEASED))
                .arg(&**value)
                .arg(req.lease.as_millis() as u64)
                .arg(place)
                .arg(u8::from(req.fenced));
        });
        self.take_by_script(keys, value, call).await
    }

    /// Takes `req`'s waiter out of the line, waking the next one if it heads it now.
    /// `fair_leave.lua` only removes, so a full server still runs it.
    pub(super) async fn leave_fair(&self, req: &Request) -> Result<(), LockError> {
        let owner = self.owner(req);
        let keys = &req.keys;
        let conn = self.client.conn();
        let reply = conn
            .eval(&FAIR_LEAVE, conn.timeout(), |c| {
                c.arg(3)
                    .arg(&keys.key)
                    .arg(suffixed(&keys.key, QUEUE))
                    .arg(suffixed(&keys.key, TIMEOUTS))
                    .arg(&owner)
                    .arg(suffixed(&keys.key, RELEASED));
            })
            .await?;
        match code_value("fair_leave", reply)? {
            (Code::Done, _) => Ok(()),
            (code, _) => Err(LockError::UnexpectedReply(format!(
                "fair_leave.lua answered {code:?}"
            ))),
        }
    }
}
