//! The acquisition protocol: re-enter locally, or take a fresh grant in the store
//! (waiting for a release when busy), and give back a grant that came too late.

use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use super::core::Core;
use super::guard::LockGuard;
use super::registry::{Enter, Grant};
use super::seam::{Backend, Granted, Order, Taken, Validity};
use super::{LockOptions, Request, Resolved};
use crate::client::cleanup::OnDrop;
use crate::client::config::{MAX_LEASE, proven};
use crate::client::store::key::{LockMode, LockName};
use crate::client::wait::{Listen, Turn, wait_for_turn};
use crate::error::LockError;
use crate::metrics::{self, Acquired, Series};

impl<B: Backend> Core<B> {
    /// Takes the lock `name` with `options` resolved against the store's config (a
    /// session store's grants are all watched, without a cap: it has no fixed lease).
    pub(crate) async fn acquire_named<N: LockName>(
        self: &Arc<Self>,
        name: N,
        options: LockOptions,
    ) -> Result<LockGuard<B>, LockError> {
        let (request, wait) = self.request(&name, options)?;
        drop(name);
        self.acquire(&request, wait).await
    }

    /// The request for the lock `name` with `options` resolved against the store's
    /// config, and its wait budget.
    pub(crate) fn request<N: LockName>(
        &self,
        name: &N,
        options: LockOptions,
    ) -> Result<(Request, Duration), LockError> {
        let config = self.config();
        let resolved = Resolved::new(config, options)?;
        let mut request = resolved.request(&config.namespace, name)?;
        if !B::CAPABILITIES.fixed_leases {
            request.watchdog = true;
            request.max_hold = None;
            request.lease = config.watchdog_lease();
        }
        Ok((request, resolved.wait))
    }

    /// Takes the lock for `req`, waiting up to `wait`, and counts the outcome once.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        req: &Request,
        wait: Duration,
    ) -> Result<LockGuard<B>, LockError> {
        let started = Instant::now();
        let mut reentered = false;
        let result = self.enter_or_take(req, wait, started, &mut reentered).await;
        let outcome = Acquired::of(&result, reentered);
        let series = Series {
            store: self.backend.kind(),
            primitive: req.primitive,
        };
        // A fresh grant's wait ends when its reply came in: no second clock reading.
        let ended = match &result {
            Ok(guard) if !reentered => Some(guard.grant.granted),
            _ => None,
        };
        metrics::acquired(series, outcome, started, ended);
        result
    }

    /// Re-enters the scope's grant (setting `reentered`) or takes a fresh one.
    async fn enter_or_take(
        self: &Arc<Self>,
        req: &Request,
        wait: Duration,
        started: Instant,
        reentered: &mut bool,
    ) -> Result<LockGuard<B>, LockError> {
        if Handle::try_current().is_err() {
            return Err(LockError::InvalidConfig(
                "locks must be taken inside a tokio runtime".into(),
            ));
        }
        if req.keys.mode.is_read_write() && !B::CAPABILITIES.shared {
            return Err(LockError::Unsupported {
                key: req.keys.name().to_owned(),
                reason: "this store has no read or write holds: take a plain lock, or use \
                         a store with read-write locks (see the README)",
            });
        }
        if req.value.is_some() && !B::CAPABILITIES.values {
            return Err(LockError::Unsupported {
                key: req.keys.name().to_owned(),
                reason: "this store keeps no value beside a hold: leave out \
                         `LockOptions::value`, or use a store that keeps one (etcd)",
            });
        }
        if req.fair && !B::CAPABILITIES.fair(req.keys.mode) {
            return Err(LockError::Unsupported {
                key: req.keys.name().to_owned(),
                reason: "this store keeps no line for this lock: leave out \
                         `LockOptions::fair`, or use a store that grants it in arrival \
                         order (see the README's fair lock section)",
            });
        }
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let scope = req.scope.id();
        let ticket = loop {
            match self.registry.enter(&req.keys, scope, req.watchdog) {
                Enter::Refused(why) => return Err(why),
                Enter::Reentered(grant) => {
                    *reentered = true;
                    // Boxed, as the line's leaving below: a fresh grant's future stays
                    // the size of its own path.
                    return Box::pin(self.reentered(grant, req)).await;
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
                    if tokio::time::timeout_at(until, ready).await.is_err() {
                        return Err(self.miss(req, wait, started, Duration::ZERO));
                    }
                }
            }
        };
        // Built only if the lock is busy: an uncontended acquisition never listens.
        let channel = std::sync::OnceLock::new();
        let listen = || {
            let channel = channel.get_or_init(|| self.backend.channel(req));
            self.backend.listen(&req.keys, channel)
        };
        // Why the last attempt failed, if not for a holder: reported if the wait ends.
        let failure = std::sync::Mutex::new(None);
        // A fair waiter that goes without the lock leaves its line; if the acquisition
        // is dropped, in the background.
        let in_line = req.fair && B::CAPABILITIES.order == Order::Line && !wait.is_zero();
        let leave = in_line.then(|| OnDrop::new(|| self.leave_in_background(req)));
        let turn = wait_for_turn(&self.config().backoff, listen, deadline, |_| {
            self.attempt(req, started, deadline, &failure)
        })
        .await;
        if let Some(leave) = leave {
            if !matches!(turn, Ok(Ok(_)))
                && let Err(e) = Box::pin(self.backend.leave(req)).await
            {
                tracing::debug!(lock = %req.keys.name(), error = %e, "leaving the line failed; the place lapses");
            }
            leave.disarm();
        }
        match turn? {
            Ok(g) => {
                // A release message wakes one waiter of this client; a reader that got
                // in wakes the next, since readers share.
                if req.keys.mode == LockMode::Read
                    && let Some(channel) = channel.get()
                    && let Some(Listen::Hub(hub, channel)) = self.backend.listen(&req.keys, channel)
                {
                    hub.notify_local(channel);
                }
                let (arrived, token) = (g.arrived, g.token);
                let grant = Arc::new(Grant::new(req.keys.clone(), scope, req.primitive, g));
                if req.watchdog {
                    let mut st = grant.state();
                    if !st.kept {
                        st.watched = 1;
                        st.next_renewal = Some(arrived + self.watchdog.period());
                        st.renew_until = req.max_hold.and_then(|m| arrived.checked_add(m));
                    }
                }
                ticket.fulfil(grant.clone());
                self.schedule(&grant);
                self.watch_store_loss(&grant);
                tracing::debug!(lock = %req.keys.name(), ?token, waited = ?arrived.duration_since(started), "lock granted");
                Ok(LockGuard::new(self.clone(), grant, req.watchdog))
            }
            Err(retry_after) => Err(failure
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| self.miss(req, wait, started, retry_after))),
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
                key: req.keys.name().to_owned(),
                retry_after,
            }
        } else {
            tracing::debug!(lock = %req.keys.name(), ?wait, "lock wait timed out");
            LockError::Timeout {
                key: req.keys.name().to_owned(),
                waited: started.elapsed(),
            }
        }
    }

    /// One acquisition attempt of the acquisition begun at `started`, as a fresh grant
    /// number, waiting at most until `deadline` where the store waits inside the server.
    async fn attempt(
        self: &Arc<Self>,
        req: &Request,
        started: Instant,
        deadline: Instant,
        failure: &std::sync::Mutex<Option<LockError>>,
    ) -> Result<Turn<Granted<B::Grant>>, LockError> {
        let seq = self.next_seq();
        match self.backend.take(req, seq, deadline).await? {
            Taken::Granted {
                grant,
                token,
                valid,
            } => {
                let arrived = Instant::now();
                if matches!(valid, Validity::Until(until) if arrived >= until) {
                    // The reply came after the lease it granted: nothing of it can be
                    // relied on, so give it back now rather than block everyone.
                    tracing::warn!(lock = %req.keys.name(), "grant arrived with no validity left; given back");
                    let undo = OnDrop::new(|| self.give_back_in_background(req, &grant));
                    let result = Box::pin(self.backend.give_back(&req.keys, &grant)).await;
                    undo.disarm();
                    // Lost in the meantime or not, it is not ours any more.
                    let _ = result?;
                    // Unless a later attempt says otherwise, this is why it failed:
                    // nobody else holds the lock.
                    *failure.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(LockError::ValidityExhausted {
                            key: req.keys.name().to_owned(),
                            elapsed: arrived.duration_since(started),
                            lease: req.lease,
                        });
                    return Ok(Turn::Retry(Duration::ZERO));
                }
                Ok(Turn::Done(Granted {
                    grant,
                    seq,
                    // Whatever the store numbered a read hold with, it is no token.
                    token: token.filter(|_| req.keys.mode.is_fenced()),
                    valid,
                    arrived,
                }))
            }
            Taken::Busy {
                retry_after,
                failure: why,
            } => {
                *failure.lock().unwrap_or_else(|e| e.into_inner()) = why;
                Ok(Turn::Retry(retry_after))
            }
        }
    }

    /// Takes a fair waiter out of its line in the background.
    fn leave_in_background(self: &Arc<Self>, req: &Request) {
        let (core, req) = (self.clone(), req.clone());
        let name = req.keys.name().to_owned();
        crate::client::cleanup::spawn("leaving a fair lock's line", name, async move {
            core.backend.leave(&req).await
        });
    }

    /// Gives back a grant nobody holds (an interrupted undo) in the background.
    fn give_back_in_background(self: &Arc<Self>, req: &Request, grant: &B::Grant) {
        let (core, keys, grant) = (self.clone(), req.keys.clone(), grant.clone());
        crate::client::cleanup::spawn("undoing a late grant", keys.name().to_owned(), async move {
            core.backend.give_back(&keys, &grant).await.map(|_| ())
        });
    }

    /// The scope already holds the grant: one more hold, and a longer lease if this
    /// hold asks for more than the grant has left.
    async fn reentered(
        self: &Arc<Self>,
        grant: Arc<Grant<B>>,
        req: &Request,
    ) -> Result<LockGuard<B>, LockError> {
        let guard = LockGuard::new(self.clone(), grant.clone(), req.watchdog);
        if grant.state().kept {
            // The store keeps it while held: no lease to renew or lengthen.
        } else if req.watchdog && !B::CAPABILITIES.renews && B::CAPABILITIES.fixed_leases {
            // A store that keeps its watched grants itself (memory) keeps a fixed-lease
            // grant that a watched hold re-enters, up to that hold's cap: no watchdog
            // renews it there. A grant a watched hold has capped keeps that cap.
            // A cap past what the clock holds is no cap.
            let now = Instant::now();
            let cap = req
                .max_hold
                .and_then(|m| now.checked_add(m).map(|until| (m, until)));
            let uncapped = {
                let mut st = grant.state();
                let uncapped = st.renew_until.is_none();
                if uncapped {
                    st.renew_until = cap.map(|(_, until)| until);
                }
                uncapped
            };
            if uncapped {
                match cap {
                    Some((cap, _)) => self.extend_grant(&grant, cap).await?,
                    None => self.keep_grant(&grant)?,
                }
            }
        } else if req.watchdog {
            let mut st = grant.state();
            let now = Instant::now();
            // A cap once passed stays passed: its grant is left to run out.
            if st.next_renewal.is_none() && st.renew_until.is_none_or(|cap| now < cap) {
                // The first watched hold of a fixed-lease grant: renew from now on.
                st.next_renewal = Some(now);
                st.renew_until = req.max_hold.and_then(|m| now.checked_add(m));
            }
            drop(st);
            self.schedule(&grant);
        } else {
            let needed = proven(Instant::now(), req.lease);
            let short = grant.state().valid_until < needed;
            if short {
                // Dropping the guard on failure gives the hold back.
                self.extend_grant(&grant, req.lease).await?;
            }
        }
        tracing::debug!(lock = %req.keys.name(), "lock re-entered");
        Ok(guard)
    }
}
