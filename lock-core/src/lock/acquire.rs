//! The acquisition protocol: re-enter locally, or take a fresh grant in Redis (waiting
//! for a release when busy), and undo a grant whose outcome is unknown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::Request;
use super::core::Core;
use super::guard::LockGuard;
use super::registry::{Enter, Grant};
use crate::client::cleanup::{self, OnDrop};
use crate::client::config::{MAX_LEASE, drift};
use crate::client::store::batch::{Entry, Turn as LaneTurn};
use crate::client::store::key::{LockKeys, WAITERS};
use crate::client::store::scripts::{ACQUIRE, AcquireReply};
use crate::client::wait::{Turn, wait_for_turn};
use crate::error::LockError;
use crate::metrics::{self, Acquired};

/// What a granted attempt brings back.
struct Granted {
    value: String,
    seq: u64,
    /// Taken with the grant (a fenced request, or a grant through the script).
    token: Option<u64>,
    valid_until: Instant,
}

impl Core {
    /// Takes the lock for `req`, waiting up to `wait`, and counts the outcome once (a
    /// part of a composite lock is counted by the composite instead).
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        req: &Request,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        let mut reentered = false;
        let result = self.enter_or_take(req, wait, started, &mut reentered).await;
        if req.part_of.is_none() {
            let outcome = Acquired::of(&result, reentered);
            metrics::acquired(self.client.kind(), outcome, started.elapsed());
        }
        result
    }

    /// Re-enters the scope's grant (setting `reentered`) or takes a fresh one.
    async fn enter_or_take(
        self: &Arc<Self>,
        req: &Request,
        wait: Duration,
        started: Instant,
        reentered: &mut bool,
    ) -> Result<LockGuard, LockError> {
        if Handle::try_current().is_err() {
            return Err(LockError::InvalidConfig(
                "locks must be taken inside a tokio runtime".into(),
            ));
        }
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let scope = req.scope.id();
        let ticket = loop {
            match self.registry.enter(&req.keys, scope, req.watchdog) {
                Enter::Reentered(grant) => {
                    *reentered = true;
                    return self.reentered(grant, req).await;
                }
                Enter::Acquire(ticket) => break ticket,
                Enter::Wait { ready, own_release } => {
                    // Our own release finishes within one command timeout, whatever
                    // the wait budget; another acquisition of the scope within ours.
                    let until = if own_release {
                        deadline.max(Instant::now() + self.conn().timeout())
                    } else {
                        deadline
                    };
                    if tokio::time::timeout_at(until.into(), ready).await.is_err() {
                        return Err(self.miss(req, wait, started, Duration::ZERO));
                    }
                }
            }
        };
        let linger = if wait.is_zero() {
            0
        } else {
            // The waiter marker outlives the holder's lease by the longest sleep
            // between two attempts, so a waiter is always marked while it waits.
            (self.config().backoff.max + self.conn().timeout()).as_millis() as u64
        };
        // Built only if the lock is busy: an uncontended acquisition never listens.
        let channel = std::sync::OnceLock::new();
        let listen = || {
            Some((
                self.client.hub(),
                channel.get_or_init(|| req.keys.channel()).as_str(),
            ))
        };
        let turn = wait_for_turn(&self.config().backoff, listen, deadline, |_| {
            self.attempt(req, linger)
        })
        .await?;
        match turn {
            Ok(g) => {
                let grant = Arc::new(Grant::new(
                    req.keys.clone(),
                    scope,
                    g.value,
                    g.token.map(|t| self.token(g.seq, t)),
                    g.seq,
                    g.valid_until,
                    req.part_of.unwrap_or(self.client.kind()),
                    req.part_of.is_none(),
                ));
                if req.watchdog {
                    let mut st = grant.state();
                    st.watched = 1;
                    st.next_renewal = Some(Instant::now() + self.config().watchdog_period());
                    st.renew_until = req.max_hold.and_then(|m| Instant::now().checked_add(m));
                }
                ticket.fulfil(grant.clone());
                self.watchdog.schedule(&grant);
                tracing::debug!(lock = %req.keys.name, token = ?g.token, waited = ?started.elapsed(), "lock granted");
                Ok(LockGuard::new(self.clone(), grant, req.watchdog))
            }
            Err(retry_after) => Err(self.miss(req, wait, started, retry_after)),
        }
    }

    fn miss(
        &self,
        req: &Request,
        wait: Duration,
        started: Instant,
        retry_after: Duration,
    ) -> LockError {
        if wait.is_zero() {
            LockError::Busy {
                key: req.keys.name.clone(),
                retry_after,
            }
        } else {
            tracing::debug!(lock = %req.keys.name, ?wait, "lock wait timed out");
            LockError::Timeout {
                key: req.keys.name.clone(),
                waited: started.elapsed(),
            }
        }
    }

    /// One acquisition attempt with a fresh grant value. Unfenced, a plain `SET NX PX`
    /// first, sent at once whatever else is in flight (concurrent commands share the
    /// connection's pipeline; inside a script the same SET costs Redis several times
    /// more). Only what needs the script goes through the acquire lane (alone, or an
    /// entry of the next batched call): a fenced request, and a lock the SET found
    /// busy (the script leaves the waiter marker and reads the holder's lease).
    async fn attempt(
        self: &Arc<Self>,
        req: &Request,
        linger: u64,
    ) -> Result<Turn<Granted>, LockError> {
        let (value, seq) = self.next_grant(&req.scope);
        let keys = &req.keys;
        let lease = req.lease;
        let sent = Instant::now();
        let entry = || {
            // Queued: a grant its caller will not take (gone), or an unknown outcome (an
            // error), is given back once the reply is in.
            let (core, k, v) = (self.clone(), keys.clone(), value.clone());
            Entry::new()
                .key(&keys.key)
                .key(&keys.fence())
                .key_suffixed(&keys.key, WAITERS)
                .arg(&value)
                .arg(lease.as_millis() as u64)
                .arg(linger)
                .arg(u8::from(req.fenced))
                .cleanup(move |reply| {
                    let Some(reply) = reply else {
                        return; // never sent
                    };
                    let granted = reply.and_then(AcquireReply::decode);
                    if !matches!(granted, Ok(AcquireReply::Busy { .. })) {
                        core.give_back_in_background(&k, &v);
                    }
                })
        };
        // Until the reply is in, the grant may exist: a cancelled or failed call is
        // undone in the background (the value is this attempt's own).
        let undo = || OnDrop::new(|| self.give_back_in_background(keys, &value));
        let granted_by_set = !req.fenced && {
            let undo = undo();
            let granted = self.plain_set(req, &value).await?;
            undo.disarm();
            granted
        };
        let reply = if granted_by_set {
            AcquireReply::Granted { token: None }
        } else {
            self.attempt_script(keys, entry, undo).await?
        };
        match reply {
            AcquireReply::Granted { token } => {
                let valid_until = sent + lease - drift(lease);
                if Instant::now() >= valid_until {
                    // The reply came after the lease it granted: nothing of it can be
                    // relied on, so give it back now rather than block everyone.
                    tracing::warn!(lock = %keys.name, "grant arrived with no validity left; given back");
                    let undo = undo();
                    let result = self.delete_call(keys, &value).await;
                    undo.disarm();
                    result?;
                    return Ok(Turn::Retry(Duration::ZERO));
                }
                Ok(Turn::Done(Granted {
                    value,
                    seq,
                    token,
                    valid_until,
                }))
            }
            AcquireReply::Busy { pttl_ms } => Ok(Turn::Retry(Duration::from_millis(pttl_ms))),
        }
    }

    /// `SET key value NX PX lease`, what the raw recipe costs: whether it granted.
    async fn plain_set(&self, req: &Request, value: &str) -> Result<bool, LockError> {
        let mut set = redis::cmd("SET");
        set.arg(&req.keys.key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(req.lease.as_millis() as u64);
        let reply: Option<String> = self.conn().query("acquire", &set).await?;
        Ok(reply.is_some())
    }

    /// The attempt through `acquire.lua`: alone on its lane, or queued as an entry of
    /// the next batch. `undo` arms the give-back of a grant whose outcome is unknown
    /// (a queued entry's error is its cleanup's to undo instead).
    async fn attempt_script<U>(
        &self,
        keys: &LockKeys,
        entry: impl FnOnce() -> Entry,
        undo: impl Fn() -> OnDrop<U>,
    ) -> Result<AcquireReply, LockError>
    where
        U: FnOnce(),
    {
        let (value, undo) = match self.conn().turn(&ACQUIRE, &keys.key, entry) {
            LaneTurn::Alone(alone, entry) => {
                let undo = undo();
                let value = self.conn().send_one(&ACQUIRE, &entry()).await;
                drop(alone);
                (value?, undo)
            }
            // An error is the queued entry's cleanup's to undo: armed only after.
            LaneTurn::Queued(pending) => (pending.await?, undo()),
        };
        let reply = AcquireReply::decode(value)?;
        undo.disarm();
        Ok(reply)
    }

    /// Gives back the grant `value` of `keys` in the background (compare-and-delete).
    fn give_back_in_background(self: &Arc<Self>, keys: &Arc<LockKeys>, value: &str) {
        let (core, keys, value) = (self.clone(), keys.clone(), value.to_owned());
        let name = keys.name.clone();
        cleanup::spawn("undoing an unfinished acquisition", name, async move {
            core.delete_call_patiently(&keys, &value).await.map(|_| ())
        });
    }

    /// The scope already holds the grant: one more hold, and a longer lease if this
    /// hold asks for more than the grant has left.
    async fn reentered(
        self: &Arc<Self>,
        grant: Arc<Grant>,
        req: &Request,
    ) -> Result<LockGuard, LockError> {
        let guard = LockGuard::new(self.clone(), grant.clone(), req.watchdog);
        if req.watchdog {
            let mut st = grant.state();
            if st.next_renewal.is_none() {
                // The first watched hold of a fixed-lease grant: renew from now on.
                st.next_renewal = Some(Instant::now());
                st.renew_until = req.max_hold.and_then(|m| Instant::now().checked_add(m));
            }
            drop(st);
            self.watchdog.schedule(&grant);
        } else {
            let needed = Instant::now() + req.lease - drift(req.lease);
            let short = grant.state().valid_until < needed;
            if short {
                // Dropping the guard on failure gives the hold back.
                self.extend_grant(&grant, req.lease).await?;
            }
        }
        tracing::debug!(lock = %req.keys.name, "lock re-entered");
        Ok(guard)
    }
}
