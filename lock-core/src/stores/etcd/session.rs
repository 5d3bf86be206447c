//! The client's session: one etcd lease that every contender key of the client lives
//! under, granted on first use and again after it was lost, kept alive by the
//! engine's watchdog while grants are held and by waiters while they wait.

use std::time::Duration;

use etcd_client as etcd;
use tokio::time::Instant;

use super::members::Members;
use crate::client::config::proven;
use crate::error::LockError;

/// A lease as last confirmed.
#[derive(Debug, Clone, Copy)]
pub(super) struct Lease {
    pub(super) id: i64,
    /// What the server keeps it for after each keep-alive.
    pub(super) ttl: Duration,
    /// Until then, by the local clock (from before the confirming request was sent,
    /// less the drift allowance).
    pub(super) valid_until: Instant,
}

/// What a keep-alive of one lease found.
pub(super) enum KeptAlive {
    /// Alive, and known to be until then.
    Until(Instant),
    /// The server no longer has it: expired, or revoked.
    Gone,
}

#[derive(Debug)]
pub(super) struct Session {
    /// The TTL asked for, in whole seconds (etcd's unit).
    ttl_secs: i64,
    lease: tokio::sync::Mutex<Option<Lease>>,
}

impl Session {
    pub(super) fn new(ttl: Duration) -> Self {
        let ttl_secs = i64::try_from(ttl.as_millis().div_ceil(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        Self {
            ttl_secs,
            lease: tokio::sync::Mutex::new(None),
        }
    }

    /// The lease, known to last at least `fresh_for` more: kept alive first if it
    /// would last less, granted anew if there is none or it was lost.
    pub(super) async fn lease(
        &self,
        members: &Members,
        fresh_for: Duration,
    ) -> Result<Lease, LockError> {
        let mut current = self.lease.lock().await;
        let now = Instant::now();
        if let Some(lease) = *current {
            if lease.valid_until >= now + fresh_for {
                return Ok(lease);
            }
            if lease.valid_until > now {
                match keep_alive(members, lease).await? {
                    KeptAlive::Until(valid_until) => {
                        let lease = Lease {
                            valid_until,
                            ..lease
                        };
                        *current = Some(lease);
                        return Ok(lease);
                    }
                    KeptAlive::Gone => *current = None,
                }
            }
        }
        let sent = Instant::now();
        let ttl_secs = self.ttl_secs;
        let granted = members
            .call("granting the session lease", |c| async move {
                c.lease_client().grant(ttl_secs, None).await
            })
            .await?;
        // The server may raise a short TTL to its minimum: it says which it keeps.
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(1).max(1));
        let lease = Lease {
            id: granted.id(),
            ttl,
            valid_until: proven(sent, ttl),
        };
        *current = Some(lease);
        Ok(lease)
    }

    /// Keeps `lease` alive now (the watchdog's renewal, an extension): what the server
    /// said of it. A lease found gone is forgotten, so the next acquisition grants a
    /// new one.
    pub(super) async fn renew(
        &self,
        members: &Members,
        lease: Lease,
    ) -> Result<KeptAlive, LockError> {
        let kept = keep_alive(members, lease).await?;
        let mut current = self.lease.lock().await;
        match (&mut *current, &kept) {
            (Some(l), KeptAlive::Until(t)) if l.id == lease.id => {
                l.valid_until = l.valid_until.max(*t);
            }
            (Some(l), KeptAlive::Gone) if l.id == lease.id => *current = None,
            _ => {}
        }
        Ok(kept)
    }

    /// Forgets `id` (the server refused a key under it: it is gone).
    pub(super) async fn forget(&self, id: i64) {
        let mut current = self.lease.lock().await;
        if current.is_some_and(|l| l.id == id) {
            *current = None;
        }
    }

    /// The lease in use, if any (revoked when the client goes).
    pub(super) fn current(&self) -> Option<Lease> {
        self.lease.try_lock().ok().and_then(|l| *l)
    }
}

/// One keep-alive of `lease` on a stream of its own (one request, one answer: the
/// renewals are seconds apart, and a stream kept open would need its own repair).
async fn keep_alive(members: &Members, lease: Lease) -> Result<KeptAlive, LockError> {
    let sent = Instant::now();
    let answer = members
        .call("keeping the session lease alive", |c| async move {
            match c.lease_client().keep_alive(lease.id).await {
                Ok(_) => Ok(true),
                // How etcd-client reports a keep-alive answered with TTL 0.
                Err(etcd::Error::LeaseKeepAliveError(m)) if m.contains("not found") => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await?;
    Ok(if answer {
        KeptAlive::Until(proven(sent, lease.ttl))
    } else {
        KeptAlive::Gone
    })
}
