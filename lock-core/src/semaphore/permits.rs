//! `Permits`: proof of holding permits of a [`Semaphore`], with release and extend.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Semaphore;
use crate::client::config::{check_lease, proven};
use crate::client::store::scripts::{SEMAPHORE_EXTEND, SEMAPHORE_RELEASE};
use crate::error::LockError;

/// Permits taken from a [`Semaphore`], each with its own id.
///
/// Behavior:
/// - [`release`](Self::release) gives them back and says how many were still held: all of
///   them normally, fewer when some leases had passed (those were already free again and
///   may have been granted to someone else meanwhile). That is reported, not an error.
/// - [`extend`](Self::extend) sets a new lease from now on the permits still held, and
///   says how many those were; expired permits are never revived.
/// - Dropped without `release` (early return, `?`, panic, a cancelled future), they are
///   released in the background (on the dropping task's runtime, or the process's
///   background runtime when there is none). Dropping never blocks. If Redis cannot be reached then, the lease frees them.
/// - [`valid_for`](Self::valid_for) is this process's estimate of the remaining lease:
///   measured from before the grant, less the drift allowance of locks (1% + 2 ms), as
///   Redis counts the lease from its own clock in whole milliseconds.
#[must_use = "dropping Permits releases them at once"]
pub struct Permits {
    semaphore: Semaphore,
    ids: Vec<String>,
    valid_until: Mutex<Instant>,
    done: bool,
}

impl std::fmt::Debug for Permits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permits")
            .field("semaphore", &self.semaphore.name())
            .field("ids", &self.ids)
            .field("valid_for", &self.valid_for())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Permits {
    pub(super) fn new(semaphore: Semaphore, ids: Vec<String>, valid_until: Instant) -> Self {
        Self {
            semaphore,
            ids,
            valid_until: Mutex::new(valid_until),
            done: false,
        }
    }

    /// The ids of the permits, as stored in the semaphore's sorted set.
    pub fn ids(&self) -> &[String] {
        &self.ids
    }

    /// How many permits this is (the `n` they were acquired with).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Always false: an acquisition takes at least one permit.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The semaphore the permits belong to.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// How long the lease is known to last from now (zero once it has passed).
    pub fn valid_for(&self) -> Duration {
        lock(&self.valid_until).saturating_duration_since(Instant::now())
    }

    /// Gives the permits back. Returns how many were still held; fewer than
    /// [`len`](Self::len) means the lease of the others had passed. Waiters, in this
    /// process and others, are woken.
    ///
    /// Cancelled while the call is in flight, the release finishes in the background. A
    /// call Redis did not answer (unreachable, the connection dropped, timed out) returns
    /// its error, and the release is sent again in the background, as for dropped
    /// permits: they come back as soon as a try gets through, else at their lease's end.
    pub async fn release(mut self) -> Result<usize, LockError> {
        // Armed until Redis answers: dropped before then, `self` releases in the
        // background (giving back ids already given back changes nothing).
        let reply = release_ids(&self.semaphore, &self.ids).await;
        if matches!(&reply, Err(e) if e.is_no_answer()) {
            return reply;
        }
        self.done = true;
        let released = reply?;
        log_release(&self.semaphore, released, self.ids.len());
        Ok(released)
    }

    /// Sets the lease of the permits still held to `lease` from now (longer or shorter).
    /// Returns how many were still held and got the new lease; fewer than
    /// [`len`](Self::len) means the others had expired, and they stay expired.
    pub async fn extend(&self, lease: Duration) -> Result<usize, LockError> {
        check_lease("permit lease", lease)?;
        let inner = &self.semaphore.shared.client;
        let start = Instant::now();
        let reply: i64 = inner
            .conn()
            .invoke("semaphore extend", &SEMAPHORE_EXTEND, |c| {
                c.arg(1)
                    .arg(&self.semaphore.shared.key)
                    .arg(lease.as_millis() as u64);
                for id in &self.ids {
                    c.arg(id);
                }
            })
            .await?;
        let extended = count(reply, self.ids.len(), "semaphore_extend.lua")?;
        let mut valid_until = lock(&self.valid_until);
        if extended > 0 {
            *valid_until = proven(start, lease);
        } else {
            *valid_until = Instant::now().min(*valid_until);
        }
        drop(valid_until);
        if extended < self.ids.len() {
            tracing::warn!(semaphore = %self.semaphore.name(), extended, expired = self.ids.len() - extended, "permits expired before extend");
        }
        Ok(extended)
    }
}

impl Drop for Permits {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let semaphore = self.semaphore.clone();
        let ids = std::mem::take(&mut self.ids);
        let name = semaphore.name().to_owned();
        crate::client::cleanup::spawn("releasing dropped permits", name, async move {
            let release = || release_ids(&semaphore, &ids);
            match crate::client::cleanup::patiently("a permits release", release)
                .await
                .0
            {
                Ok(released) => log_release(&semaphore, released, ids.len()),
                Err(e) => {
                    tracing::warn!(semaphore = %semaphore.name(), error = %e, "dropped permits could not be released; their lease will free them")
                }
            }
            Ok(())
        });
    }
}

/// Checks a count reply of a script that was handed `asked` ids.
fn count(reply: i64, asked: usize, script: &str) -> Result<usize, LockError> {
    usize::try_from(reply)
        .ok()
        .filter(|n| *n <= asked)
        .ok_or_else(|| LockError::UnexpectedReply(format!("{script} returned {reply}")))
}

fn log_release(semaphore: &Semaphore, released: usize, held: usize) {
    if released < held {
        tracing::warn!(semaphore = %semaphore.name(), released, expired = held - released, "permits expired before release");
    } else {
        tracing::debug!(semaphore = %semaphore.name(), released, "permits released");
    }
}

/// One release script call; wakes local waiters when permits came back.
async fn release_ids(semaphore: &Semaphore, ids: &[String]) -> Result<usize, LockError> {
    if ids.is_empty() {
        return Ok(0);
    }
    let shared = &semaphore.shared;
    let inner = &shared.client;
    let reply: i64 = inner
        .conn()
        .invoke("semaphore release", &SEMAPHORE_RELEASE, |c| {
            c.arg(2)
                .arg(&shared.key)
                .arg(&shared.channel)
                .arg(inner.id_hex());
            for id in ids {
                c.arg(id);
            }
        })
        .await?;
    let released = count(reply, ids.len(), "semaphore_release.lua")?;
    if released > 0 {
        // Our own release message is ignored by our hub: wake our waiters directly.
        inner.hub().notify_local(&shared.channel);
    }
    Ok(released)
}

/// Ids sent in an acquire call whose outcome is not known yet. Dropped armed (a Redis
/// error, a timeout, or the future dropped mid-request), it releases them in the
/// background: the script may have granted them.
pub(super) struct Pending {
    semaphore: Semaphore,
    ids: Vec<String>,
}

impl Pending {
    pub(super) fn new(semaphore: Semaphore, ids: Vec<String>) -> Self {
        Self { semaphore, ids }
    }

    /// The ids whose outcome is not known yet.
    pub(super) fn ids(&self) -> &[String] {
        &self.ids
    }

    /// The outcome is known: hands the ids over and makes drop a no-op.
    pub(super) fn disarm(&mut self) -> Vec<String> {
        std::mem::take(&mut self.ids)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.ids.is_empty() {
            return;
        }
        let semaphore = self.semaphore.clone();
        let ids = std::mem::take(&mut self.ids);
        let name = semaphore.name().to_owned();
        crate::client::cleanup::spawn("undoing an unfinished acquire", name, async move {
            let release = || release_ids(&semaphore, &ids);
            crate::client::cleanup::patiently("a permits release", release)
                .await
                .0
                .map(drop)
        });
    }
}
