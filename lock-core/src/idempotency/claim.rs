//! `Claim`: the right to run the request behind an idempotency key, then store its
//! response or free the key.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{IdempotencyKeys, IdempotencyStore};
use crate::client::Client;
use crate::client::store::batch::{Turn, builder};
use crate::client::store::decode;
use crate::client::store::scripts::{
    IDEMPOTENCY_ABANDON, IDEMPOTENCY_COMPLETE, IDEMPOTENCY_EXTEND,
};
use crate::error::LockError;

/// A claimed idempotency key (from [`Begin::New`](super::Begin::New)).
///
/// Behavior:
/// - [`complete`](Self::complete) stores the response record for the retention window;
///   [`abandon`](Self::abandon) frees the key so a retry runs again. Both check that the
///   claim is still this one's: after the lease ran out they fail with
///   [`LockError::Expired`] (nobody holds the key) or [`LockError::NotOwner`] (another
///   request claimed it meanwhile), and change nothing.
/// - The in-flight lease is renewed only by [`keep_alive`](Self::keep_alive) (or
///   [`extend`](Self::extend)): poll that future next to the work. This is the one
///   renewal mechanism of a claim; with nothing renewing, the key frees itself one lease
///   after the claim.
/// - Dropped without `complete` or `abandon` (early return, panic, a cancelled future, a
///   `complete` that failed on a Redis error), the claim is abandoned in the background
///   (on the dropping task's runtime, or the process's background runtime). Dropping never blocks; if Redis cannot be reached
///   then, the lease frees the key.
#[must_use = "dropping a Claim abandons it: the key is freed in the background"]
pub struct Claim {
    shared: Arc<Shared>,
    done: bool,
}

struct Shared {
    client: Client,
    keys: Arc<IdempotencyKeys>,
    /// The record's value while this claim holds it: `F<fingerprint> <owner>`.
    in_flight: String,
    lease: Duration,
    claimed_at: Instant,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim")
            .field("key", &self.shared.keys.name)
            .field("in_flight", &self.shared.in_flight)
            .field("lease", &self.shared.lease)
            .finish_non_exhaustive()
    }
}

impl Claim {
    pub(super) fn new(
        client: Client,
        keys: Arc<IdempotencyKeys>,
        in_flight: String,
        lease: Duration,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                client,
                keys,
                in_flight,
                lease,
                claimed_at: Instant::now(),
            }),
            done: false,
        }
    }

    /// Makes drop a no-op (the begin script did not claim).
    pub(super) fn disarm(&mut self) {
        self.done = true;
    }

    /// Undoes [`disarm`](Self::disarm): dropped, the claim abandons itself again.
    pub(super) fn rearm(&mut self) {
        self.done = false;
    }

    /// Abandons this claim in the background when called (the claim itself may be gone
    /// by then).
    pub(super) fn abandon_later(&self) -> impl FnOnce() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || abandon_in_background(shared)
    }

    /// The key's name as stored (parts escaped and joined).
    pub fn key(&self) -> &str {
        &self.shared.keys.name
    }

    /// The Redis keys of the claimed key.
    pub fn keys(&self) -> &IdempotencyKeys {
        &self.shared.keys
    }

    /// The in-flight lease the claim was made with (and is renewed to).
    pub fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// Stores `record` as the key's outcome for `retention` (1 ms to
    /// [`IdempotencyStore::MAX_RETENTION`]); later [`begin`](IdempotencyStore::begin)s
    /// with the same fingerprint get it back as [`Begin::Completed`](super::Begin::Completed).
    /// Waiters on the key are woken.
    pub async fn complete(mut self, record: &[u8], retention: Duration) -> Result<(), LockError> {
        if retention < Duration::from_millis(1) || retention > IdempotencyStore::MAX_RETENTION {
            return Err(LockError::InvalidConfig(format!(
                "retention {retention:?} is outside 1ms..={:?}",
                IdempotencyStore::MAX_RETENTION
            )));
        }
        let s = &self.shared;
        let inner = &s.client;
        // "F<fingerprint> <owner>" becomes "D<fingerprint> <record>".
        let fingerprint = s.in_flight[1..].split(' ').next().unwrap_or_default();
        let mut done = Vec::with_capacity(fingerprint.len() + 2 + record.len());
        done.push(b'D');
        done.extend_from_slice(fingerprint.as_bytes());
        done.push(b' ');
        done.extend_from_slice(record);
        let entry = builder(|e| {
            e.key(&s.keys.record)
                .arg(&s.in_flight)
                .arg(&done[..])
                .arg(retention.as_millis() as u64)
        });
        let conn = inner.conn();
        let reply = match conn.turn(&IDEMPOTENCY_COMPLETE, &s.keys.record, entry) {
            Turn::Alone(alone, entry) => {
                let reply = conn.send_one(&IDEMPOTENCY_COMPLETE, entry).await;
                drop(alone);
                // On a Redis error the claim's drop abandons it (owner-checked, so a
                // completion that did go through is left alone).
                self.done = reply.is_ok();
                reply?
            }
            Turn::Queued(pending) => {
                // Queued, the call answers for the claim (this future dropped, or an
                // error): the claim is abandoned once its completion's fate is known
                // (owner-checked, so a completion that went through stays).
                self.done = true;
                let shared = &self.shared;
                pending
                    .or_undo(|| {
                        let shared = shared.clone();
                        move |reply: Option<Result<redis::Value, LockError>>| {
                            if !matches!(reply, Some(Ok(_))) {
                                abandon_in_background(shared);
                            }
                        }
                    })
                    .await?
            }
        };
        let reply: i64 = decode(IDEMPOTENCY_COMPLETE.op(), reply)?;
        let result = outcome(reply, &s.keys, "idempotency_complete.lua");
        if result.is_ok() {
            inner.hub().notify_local(&s.keys.channel);
        }
        result
    }

    /// Frees the key without storing anything: the next request with it runs again.
    /// Waiters on the key are woken (one of them claims it).
    pub async fn abandon(mut self) -> Result<(), LockError> {
        self.done = true;
        abandon(&self.shared).await
    }

    /// Renews the in-flight lease once, to [`lease`](Self::lease) from now.
    pub async fn extend(&self) -> Result<(), LockError> {
        extend(&self.shared).await
    }

    /// Renews the in-flight lease every third of it for as long as it is polled; poll it
    /// next to the work (e.g. in `tokio::select!`). On a Redis error it retries sooner
    /// (every quarter period, at most 1 s apart) until the lease would have run out.
    ///
    /// Resolves only when the claim is lost: a renewal was refused (the lease had run
    /// out, and maybe another request claimed the key), or renewals kept failing until
    /// the lease was over. The work then runs unprotected: a duplicate may run too, and
    /// `complete` will fail.
    pub fn keep_alive(&self) -> impl Future<Output = ()> + Send + 'static {
        let shared = self.shared.clone();
        async move {
            let lease = shared.lease;
            let period = lease / 3;
            let mut valid_until = shared.claimed_at + lease;
            let mut next = shared.claimed_at + period;
            loop {
                tokio::time::sleep_until(next.into()).await;
                let start = Instant::now();
                match extend(&shared).await {
                    Ok(()) => {
                        valid_until = start + lease;
                        next = start + period;
                    }
                    Err(e) if e.is_redis() && Instant::now() < valid_until => {
                        tracing::debug!(key = %shared.keys.name, error = %e, "idempotency claim renewal failed; retrying");
                        next = Instant::now() + (period / 4).min(Duration::from_secs(1));
                    }
                    Err(e) => {
                        tracing::warn!(key = %shared.keys.name, error = %e, "idempotency claim lost while the request ran");
                        return;
                    }
                }
            }
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        abandon_in_background(self.shared.clone());
    }
}

/// Abandons the claim in the background (a dropped claim, a queued completion left to
/// clean up).
fn abandon_in_background(shared: Arc<Shared>) {
    let name = shared.keys.name.clone();
    crate::client::cleanup::spawn("abandoning a dropped idempotency claim", name, async move {
        let (abandoned, _) =
            crate::client::cleanup::patiently("an abandon", || abandon(&shared)).await;
        match abandoned {
            Ok(()) => {
                tracing::debug!(key = %shared.keys.name, "dropped idempotency claim abandoned")
            }
            Err(e) if e.is_lost() => {}
            Err(e) => {
                tracing::warn!(key = %shared.keys.name, error = %e, "dropped idempotency claim could not be abandoned; its lease will free the key")
            }
        }
        Ok(())
    });
}

/// Maps an owner-checked script's 1 / 0 / -1.
fn outcome(reply: i64, keys: &IdempotencyKeys, script: &str) -> Result<(), LockError> {
    let key = || keys.name.clone();
    match reply {
        1 => Ok(()),
        0 => Err(LockError::Expired { key: key() }),
        -1 => Err(LockError::NotOwner { key: key() }),
        other => Err(LockError::UnexpectedReply(format!(
            "{script} returned {other}"
        ))),
    }
}

async fn abandon(s: &Shared) -> Result<(), LockError> {
    let inner = &s.client;
    let reply: i64 = inner
        .conn()
        .invoke("idempotency abandon", &IDEMPOTENCY_ABANDON, |c| {
            c.arg(1).arg(&s.keys.record).arg(&s.in_flight);
        })
        .await?;
    let result = outcome(reply, &s.keys, "idempotency_abandon.lua");
    if result.is_ok() {
        // Our own message is ignored by our hub: wake our waiters directly.
        inner.hub().notify_local(&s.keys.channel);
    }
    result
}

async fn extend(s: &Shared) -> Result<(), LockError> {
    let inner = &s.client;
    let reply: i64 = inner
        .conn()
        .invoke("idempotency extend", &IDEMPOTENCY_EXTEND, |c| {
            c.arg(1)
                .arg(&s.keys.record)
                .arg(&s.in_flight)
                .arg(s.lease.as_millis() as u64);
        })
        .await?;
    outcome(reply, &s.keys, "idempotency_extend.lua")
}
