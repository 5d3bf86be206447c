//! The idempotency store: claim a key, then complete it with a response or abandon it;
//! and server-issued one-time tokens.

mod claim;
mod token;

pub use claim::Claim;
pub use token::OneTimeTokens;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::client::config::{MAX_LEASE, check_lease};
use crate::client::store::batch::Turn as BatchTurn;
use crate::client::store::key::{LockName, suffixed};
use crate::client::store::scripts::IDEMPOTENCY_WAIT;
use crate::client::store::{Args, refused};
use crate::client::wait::{Listen, Turn, pttl_hint, wait_for_turn};
use crate::client::{Client, in_span, wanted};
use crate::error::LockError;
use crate::metrics::{self, IdempotencyOutcome};

/// What [`IdempotencyStore::begin`] found.
#[derive(Debug)]
#[non_exhaustive]
pub enum Begin {
    /// The key was free and is now claimed by the caller: run the request, then
    /// [`complete`](Claim::complete) or [`abandon`](Claim::abandon) the claim.
    New(Claim),
    /// Another claim holds the key and has not finished yet.
    InFlight {
        /// The remaining in-flight lease of that claim. A record without expiry
        /// (written by something other than this crate) has none: the config's longest
        /// backoff step.
        retry_after: Duration,
    },
    /// The key was completed with this record (the bytes given to
    /// [`Claim::complete`]): replay it.
    Completed(Vec<u8>),
    /// The key was used with another fingerprint (a different request under the same
    /// key).
    Mismatch,
}

/// The Redis keys of one idempotency key, all in one hash slot (for inspection and
/// tooling).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKeys {
    /// The escaped, joined name (store name, then the caller's parts).
    pub name: String,
    /// The record: the string `F<fingerprint> <owner>` while in flight (`W...` once a
    /// waiter marked it), `D<fingerprint> <record>` once completed.
    pub record: String,
    /// The channel announcing that the key is no longer in flight: the record's name
    /// followed by `-done`.
    pub channel: String,
}

/// Idempotency records on Redis: the primitives `lock-tower`'s idempotency layer is
/// built on. Get one with [`LockClient::idempotency_store`](crate::LockClient::idempotency_store).
///
/// Behavior:
/// - **One winner.** [`begin`](Self::begin) claims a free key atomically with the
///   request's fingerprint and an in-flight lease; every other caller sees
///   [`Begin::InFlight`], [`Begin::Completed`] with the stored record, or
///   [`Begin::Mismatch`] when its fingerprint differs (checked first, in flight or not).
/// - **Crash safety.** The in-flight record expires one lease after the last renewal,
///   so a crashed claimant frees the key by itself. [`Claim::keep_alive`] renews it
///   while the work runs.
/// - **Atomic transitions.** `begin` is one `SET NX PX GET` (it claims a free key and
///   reads a used one in the same command, so it needs no script); `complete`, `abandon`
///   and renewal are owner-checked scripts (`lua/idempotency_*.lua`): a claim whose lease
///   ran out and was taken by someone else can neither complete nor abandon the newer
///   claim (`LockError::Expired` / `LockError::NotOwner`).
/// - **Every path frees the key**: a dropped [`Claim`] (early return, panic, cancelled
///   future, failed `complete`) is abandoned in the background.
/// - **Waiting** ([`begin_or_wait`](Self::begin_or_wait)): a caller that finds the key in
///   flight subscribes to the key's channel (over the client's one pub/sub connection),
///   marks the record as waited for (`lua/idempotency_wait.lua`: `F` becomes `W`), and
///   tries again when the claim completes or is abandoned, with jittered backoff as a
///   fallback, up to its wait budget. A completion publishes only for a marked record:
///   one that nobody waits for costs Redis no `PUBLISH`. The mark is a state the
///   scripts of this version accept; a client of an earlier version, which knows only
///   `F`, cannot complete a claim that a waiter of this version marked.
/// - **Keys.** `<namespace>:{<store name><delim><parts>...}:idempotency` (the record,
///   see [`IdempotencyKeys::record`]) and `...:idempotency-done` (the channel), built by
///   [`crate::key`], so user input cannot forge another record's key.
/// - **Fingerprints** are 1 to [`MAX_FINGERPRINT_LEN`](Self::MAX_FINGERPRINT_LEN) visible ASCII characters (a hex
///   digest fits); others are [`LockError::InvalidConfig`](crate::LockError::InvalidConfig).
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{Begin, LockClient};
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// let store = client.idempotency_store("payments");
/// let lease = Duration::from_secs(10);
/// match store.begin(("user-7", "key-123"), "sha256-of-the-request", lease).await? {
///     Begin::New(claim) => {
///         let _renewing = claim.keep_alive(); // poll it alongside long work
///         let response = b"charged 10 EUR".to_vec();
///         claim.complete(&response, Duration::from_secs(24 * 3600)).await?;
///     }
///     Begin::Completed(stored) => println!("replay {} bytes", stored.len()),
///     Begin::InFlight { retry_after } => println!("still running; retry in {retry_after:?}"),
///     Begin::Mismatch => println!("that key was used for another request"),
///     _ => {}
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotencyStore {
    client: Client,
    name: Arc<str>,
}

impl std::fmt::Debug for IdempotencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyStore")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What a record's name ends with to name its channel: the completion script, which
/// names the channel itself (a channel is no key), appends the same.
pub(crate) const DONE: &str = "-done";

/// Makes claim owner ids unique within the process; the client id makes them unique
/// across processes.
static NEXT_CLAIM: AtomicU64 = AtomicU64::new(1);

impl IdempotencyStore {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            client,
            name: name.into(),
        }
    }

    /// Longest fingerprint [`begin`](Self::begin) accepts, in bytes.
    pub const MAX_FINGERPRINT_LEN: usize = 256;

    /// Longest retention [`Claim::complete`] accepts: 366 days.
    pub const MAX_RETENTION: Duration = Duration::from_secs(366 * 24 * 3600);

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Redis keys of `key` (any [`LockName`]: one part or several).
    pub fn keys<N: LockName + ?Sized>(&self, key: &N) -> Result<IdempotencyKeys, LockError> {
        let keys = self.client.prefixed_keys(&self.name, key)?;
        let record = suffixed(&keys.key, ":idempotency");
        Ok(IdempotencyKeys {
            channel: suffixed(&record, DONE),
            record,
            name: keys.name().to_owned(),
        })
    }

    /// Claims `key` for a request with `fingerprint`, or reports what happened to it
    /// (see [`Begin`]). `lease` (within [`MIN_LEASE`](crate::MIN_LEASE)`..=`[`MAX_LEASE`])
    /// is how long the claim lasts without renewal. `fingerprint` identifies the request
    /// (1 to [`MAX_FINGERPRINT_LEN`](Self::MAX_FINGERPRINT_LEN) visible ASCII characters).
    pub async fn begin<N: LockName>(
        &self,
        key: N,
        fingerprint: &str,
        lease: Duration,
    ) -> Result<Begin, LockError> {
        self.begin_or_wait(key, fingerprint, lease, Duration::ZERO)
            .await
    }

    /// Like [`begin`](Self::begin), but while the key is in flight, waits up to `wait`
    /// for the claim to complete (then returns [`Begin::Completed`]) or be abandoned
    /// (then claims it: [`Begin::New`]). After `wait`, returns [`Begin::InFlight`].
    pub async fn begin_or_wait<N: LockName>(
        &self,
        key: N,
        fingerprint: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<Begin, LockError> {
        check_lease("in-flight lease", lease)?;
        if fingerprint.is_empty()
            || fingerprint.len() > Self::MAX_FINGERPRINT_LEN
            || !fingerprint.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(LockError::InvalidConfig(format!(
                "a fingerprint must be 1 to {} visible ASCII characters",
                Self::MAX_FINGERPRINT_LEN
            )));
        }
        let keys = self.keys(&key)?;
        if Handle::try_current().is_err() {
            return Err(LockError::InvalidConfig(
                "idempotency keys must be claimed inside a tokio runtime".into(),
            ));
        }
        let span = wanted(|| tracing::debug_span!("idempotency.begin", key = %keys.name, ?wait));
        let found = in_span(span, self.begin_loop(keys, fingerprint, lease, wait)).await;
        if let Some(outcome) = outcome_of(&found) {
            metrics::idempotency(outcome);
        }
        found
    }

    async fn begin_loop(
        &self,
        keys: IdempotencyKeys,
        fingerprint: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<Begin, LockError> {
        let inner = &self.client;
        let keys = Arc::new(keys);
        let started = Instant::now();
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let keys = &keys;
        let listen = || Some(Listen::Hub(inner.hub(), keys.channel.as_str()));
        let turn = wait_for_turn(
            &inner.config().backoff,
            listen,
            deadline.into(),
            |subscribed| async move {
                Ok(
                    match self.attempt(keys, fingerprint, lease, subscribed).await? {
                        Begin::InFlight { retry_after } => Turn::Retry(retry_after),
                        found => {
                            if subscribed && !matches!(found, Begin::New(_)) {
                                // One local waiter is woken per message: pass the turn on.
                                inner.hub().notify_local(&keys.channel);
                            }
                            Turn::Done(found)
                        }
                    },
                )
            },
        )
        .await?;
        Ok(turn.unwrap_or_else(|retry_after| Begin::InFlight { retry_after }))
    }

    /// One claim attempt: `SET <record> "F<fingerprint> <owner>" NX PX <lease> GET`,
    /// atomic by itself, claims a free key or returns what is stored there. A waiter
    /// (`subscribed` to the record's channel) that finds the key in flight marks the
    /// record, so that its completion publishes.
    async fn attempt(
        &self,
        keys: &Arc<IdempotencyKeys>,
        fingerprint: &str,
        lease: Duration,
        subscribed: bool,
    ) -> Result<Begin, LockError> {
        let inner = &self.client;
        let in_flight = format!(
            "F{fingerprint} {}:{}",
            inner.id_hex(),
            NEXT_CLAIM.fetch_add(1, Ordering::Relaxed)
        );
        let lease_ms = lease.as_millis() as u64;
        let claim_cmd = |mut cmd: Args| {
            cmd.arg("SET")
                .arg(&keys.record)
                .arg(&in_flight)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms)
                .arg("GET");
            cmd
        };
        // Until the reply says otherwise the key may be claimed: dropped (error,
        // timeout, cancelled future), the claim abandons itself.
        let mut claim = Claim::new(self.client.clone(), keys.clone(), in_flight.clone(), lease);
        let conn = inner.conn();
        let reply = match conn.turn_command("idempotency begin", &keys.record, claim_cmd) {
            BatchTurn::Alone(alone, claim_cmd) => {
                let buf = Args::with_capacity(7, keys.record.len() + in_flight.len() + 24);
                let reply = conn.query("idempotency begin", &claim_cmd(buf)).await;
                drop(alone);
                // The same rule as a queued claim's cleanup: what proves nothing was
                // claimed leaves nothing to abandon.
                if not_claimed(&reply) {
                    claim.disarm();
                }
                reply?
            }
            BatchTurn::Queued(pending) => {
                // Queued, the call answers for the claim (this future dropped, or an
                // error): a key it claimed (or may have) is abandoned once the reply
                // is in.
                let abandon = claim.abandon_later();
                claim.disarm();
                let reply = pending
                    .or_undo(|| {
                        move |reply: Option<Result<redis::Value, LockError>>| {
                            if reply.is_some_and(|r| !not_claimed(&r)) {
                                abandon();
                            }
                        }
                    })
                    .await?;
                claim.rearm();
                reply
            }
        };
        let Some(mut found) = begin_reply(reply)? else {
            return Ok(Begin::New(claim));
        };
        claim.disarm();
        // "F<fingerprint> <owner>" (in flight), "W<fingerprint> <owner>" (in flight and
        // waited for) or "D<fingerprint> <record>" (completed).
        let at = fingerprint.len() + 2;
        let state = found.first().copied();
        if !matches!(state, Some(b'F' | b'W' | b'D')) {
            return Err(LockError::UnexpectedReply(format!(
                "`{}` does not hold an idempotency record",
                keys.record
            )));
        }
        let same = found.len() >= at
            && found[1..at - 1] == *fingerprint.as_bytes()
            && found[at - 1] == b' ';
        if !same {
            return Ok(Begin::Mismatch);
        }
        if state == Some(b'D') {
            found.drain(..at);
            return Ok(Begin::Completed(found));
        }
        // A waiter's mark answers as PTTL does, so both are read alike.
        let pttl: i64 = if subscribed {
            inner
                .conn()
                .invoke("idempotency wait", &IDEMPOTENCY_WAIT, |c| {
                    c.arg(1).arg(&keys.record);
                })
                .await?
        } else {
            inner
                .conn()
                .query("idempotency begin", Args::cmd("PTTL").arg(&keys.record))
                .await?
        };
        Ok(Begin::InFlight {
            retry_after: pttl_hint(pttl, inner.config().backoff.max),
        })
    }
}

/// The reply of the claim's `SET NX PX GET`: `None` claimed, or what the record holds.
fn begin_reply(reply: redis::Value) -> Result<Option<Vec<u8>>, LockError> {
    match reply {
        redis::Value::Nil => Ok(None),
        redis::Value::BulkString(found) => Ok(Some(found)),
        other => Err(LockError::UnexpectedReply(format!(
            "idempotency begin: SET NX GET answered {other:?}"
        ))),
    }
}

/// Whether a claim's reply proves it claimed nothing: the record held something (which
/// `SET NX` left alone), or the server refused the command.
fn not_claimed(reply: &Result<redis::Value, LockError>) -> bool {
    refused(reply) || matches!(reply, Ok(redis::Value::BulkString(_)))
}

/// The metrics outcome of a lookup that returned `found`; `None` for an error other
/// than Redis's (a bad key or setting decides nothing).
fn outcome_of(found: &Result<Begin, LockError>) -> Option<IdempotencyOutcome> {
    Some(match found {
        Ok(Begin::New(_)) => IdempotencyOutcome::New,
        Ok(Begin::Completed(_)) => IdempotencyOutcome::Replayed,
        Ok(Begin::InFlight { .. }) => IdempotencyOutcome::InFlight,
        Ok(Begin::Mismatch) => IdempotencyOutcome::Mismatch,
        Err(e) if e.is_redis() => IdempotencyOutcome::Unavailable,
        Err(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::DONE;
    use crate::client::store::scripts::IDEMPOTENCY_COMPLETE;

    /// The completion and the abandon publish on the channel waiters subscribe to,
    /// which they name from the record as the store's keys do.
    #[test]
    fn the_completion_publishes_on_the_records_channel() {
        let publish = format!("redis.pcall('PUBLISH', record .. '{DONE}'");
        assert!(IDEMPOTENCY_COMPLETE.source().contains(&publish));
        let publish = format!("redis.pcall('PUBLISH', KEYS[1] .. '{DONE}'");
        assert!(include_str!("../../../lua/idempotency_abandon.lua").contains(&publish));
    }
}
