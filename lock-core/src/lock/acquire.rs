//! The acquisition protocol: re-enter locally, or take a fresh grant in Redis (waiting
//! for a release when busy), and undo a grant whose outcome is unknown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use super::Request;
use super::core::Core;
use super::guard::LockGuard;
use super::registry::{Enter, Grant};
use crate::client::cleanup::OnDrop;
use crate::client::config::{MAX_LEASE, drift};
use crate::client::store::scripts::AcquireReply;
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
            metrics::acquired(self.client().kind(), outcome, started.elapsed());
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
                        deadline.max(Instant::now() + self.config().command_timeout)
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
            (self.config().backoff.max + self.config().command_timeout).as_millis() as u64
        };
        // Built only if the lock is busy: an uncontended acquisition never listens.
        let channel = std::sync::OnceLock::new();
        let listen = || {
            Some((
                self.backend.hub(),
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
                    req.part_of.unwrap_or(self.client().kind()),
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

    /// One acquisition attempt with a fresh grant value (see [`RedisBackend::take`](super::backend::RedisBackend::take)).
    async fn attempt(
        self: &Arc<Self>,
        req: &Request,
        linger: u64,
    ) -> Result<Turn<Granted>, LockError> {
        let (value, seq) = self.next_grant(&req.scope);
        let lease = req.lease;
        let sent = Instant::now();
        match self.backend.take(req, &value, linger).await? {
            AcquireReply::Granted { token } => {
                let valid_until = sent + lease - drift(lease);
                if Instant::now() >= valid_until {
                    // The reply came after the lease it granted: nothing of it can be
                    // relied on, so give it back now rather than block everyone.
                    tracing::warn!(lock = %req.keys.name, "grant arrived with no validity left; given back");
                    let undo = OnDrop::new(|| {
                        self.backend.give_back_in_background(&req.keys, &value);
                    });
                    let result = self.backend.give_back(&req.keys, &value).await;
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
