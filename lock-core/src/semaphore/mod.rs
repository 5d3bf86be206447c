//! `Semaphore`: up to N holders at once across processes, each permit with its own lease.

mod permits;

pub use permits::Permits;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::client::config::{MAX_LEASE, check_lease, proven};
use crate::client::store::key::{LockName, suffixed};
use crate::client::store::scripts::{SEMAPHORE_ACQUIRE, SEMAPHORE_AVAILABLE};
use crate::client::wait::{Listen, Turn, wait_for_turn};
use crate::client::{Client, in_span, wanted};
use crate::error::LockError;

/// Most permits one [`Semaphore::acquire`] call may take (each is one member of the
/// semaphore's sorted set and one script argument).
pub const MAX_PERMITS_PER_ACQUIRE: u32 = 1024;

/// Per-call choices for [`Semaphore::acquire`]; anything not set has the default named
/// on its setter.
///
/// ```
/// use std::time::Duration;
/// use lock_core::SemaphoreOptions;
///
/// let opts = SemaphoreOptions::new()
///     .lease(Duration::from_secs(5)) // the permits free themselves 5 s after the grant
///     .wait(Duration::from_secs(2)); // give up with `Timeout` after 2 s
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SemaphoreOptions {
    lease: Option<Duration>,
    wait: Option<Duration>,
}

impl SemaphoreOptions {
    /// Lease of a permit when the call does not choose one.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

    /// No overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the permits last unless released or extended first; within
    /// [`MIN_LEASE`](crate::MIN_LEASE)`..=`[`MAX_LEASE`]. Default
    /// [`DEFAULT_LEASE`](Self::DEFAULT_LEASE) (30 s). There is no watchdog for permits:
    /// call [`Permits::extend`] to keep them longer.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Wait budget; zero means fail at once with [`LockError::Busy`](crate::LockError::Busy). Default: the
    /// client's ([`LockConfig::with_wait`](crate::LockConfig::with_wait), 10 s).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }
}

/// A distributed counting semaphore whose permits expire: at most
/// [`limit`](Self::limit) permits of one name are in use at once, across every client and
/// process. Get one with [`LockClient::semaphore`](crate::LockClient::semaphore).
///
/// Behavior:
/// - **Permits with ids and leases.** [`acquire`](Self::acquire) takes `n` permits at
///   once or none; each has its own id ([`Permits::ids`]) and expires one lease after the
///   grant unless released or [extended](Permits::extend). A crashed or paused holder's
///   permits come back by themselves when their lease passes.
/// - **One clock.** Expiry times are taken from the Redis server's clock (`TIME` inside
///   the scripts), so the clocks of the clients do not matter.
/// - **The limit travels with each call.** It is not stored in Redis: every user of one
///   semaphore name must use the same limit. A client with a smaller limit takes permits
///   only while fewer than its limit are in use; one with a larger limit can push the
///   number in use up to its own limit.
/// - **Waiting without spinning.** A busy `acquire` subscribes to the semaphore's release
///   channel (over the client's one pub/sub connection) and retries when permits are given
///   back, in this or another process; jittered exponential backoff
///   ([`LockConfig::with_backoff`](crate::LockConfig::with_backoff)), capped by the time
///   until enough permits expire, is the fallback. The wait ends with
///   [`LockError::Timeout`](crate::LockError::Timeout) after the budget, or [`LockError::Busy`](crate::LockError::Busy) at once with a zero
///   budget ([`try_acquire`](Self::try_acquire)); the error's `key` is the semaphore's
///   name.
/// - **Clean release on every path.** [`Permits::release`] reports how many permits were
///   still held (fewer than asked when some had expired: reported, not an error); dropped
///   `Permits` are released in the background (see [`Permits`]),
///   without blocking. An acquisition that fails or is cancelled mid-request gives back
///   whatever the script may have granted.
/// - **Bad input is an error, never a panic:** a limit of zero, `n == 0`, `n` above the
///   limit or above [`MAX_PERMITS_PER_ACQUIRE`], and leases outside
///   [`MIN_LEASE`](crate::MIN_LEASE)`..=`[`MAX_LEASE`] are
///   [`LockError::InvalidConfig`](crate::LockError::InvalidConfig); a bad name is [`LockError::InvalidKey`](crate::LockError::InvalidKey).
/// - **Keys.** The permits live in the sorted set `<namespace>:{<name>}:semaphore`
///   (member: permit id, score: expiry in ms) and releases are announced on
///   `<namespace>:{<name>}:semaphore-released`; both share the name's hash tag. The
///   semaphore named `x` is independent of the lock named `x`.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::{LockClient, SemaphoreOptions};
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// // At most 5 buyers at once in the checkout of the flash sale, across all servers.
/// let checkout = client.semaphore(("seckill", "checkout"), 5)?;
///
/// let opts = SemaphoreOptions::new()
///     .lease(Duration::from_secs(10))
///     .wait(Duration::from_secs(2));
/// let permit = checkout.acquire(1, opts).await?;
/// // ... place the order; if it might take longer than the lease:
/// permit.extend(Duration::from_secs(10)).await?;
/// let released = permit.release().await?; // 1, or 0 if the lease had passed
/// # let _ = released;
///
/// // Fail at once when all 5 are taken.
/// match checkout.try_acquire(1).await {
///     Ok(permit) => drop(permit), // dropping releases in the background
///     Err(e) if e.is_busy() => println!("sold out for now"),
///     Err(e) => return Err(e),
/// }
/// println!("{} permits free", checkout.available().await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    shared: Arc<Shared>,
}

struct Shared {
    client: Client,
    name: String,
    key: String,
    channel: String,
    limit: u32,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.shared.name)
            .field("limit", &self.shared.limit)
            .finish_non_exhaustive()
    }
}

enum Attempt {
    Granted(Permits),
    /// Retry after this; `free` permits were free, too few for this request.
    Busy {
        retry_after: Duration,
        free: i64,
    },
}

/// Makes permit ids unique within the process; the client id makes them unique across.
static NEXT_PERMIT: AtomicU64 = AtomicU64::new(1);

impl Semaphore {
    pub(crate) fn new<N: LockName>(
        client: Client,
        name: N,
        permits: u32,
    ) -> Result<Self, LockError> {
        if permits == 0 {
            return Err(LockError::InvalidConfig(
                "a semaphore needs at least one permit".into(),
            ));
        }
        let keys = client.lock_keys(&name)?;
        Ok(Semaphore {
            shared: Arc::new(Shared {
                client,
                key: suffixed(&keys.key, ":semaphore"),
                channel: suffixed(&keys.key, ":semaphore-released"),
                name: keys.name().to_owned(),
                limit: permits,
            }),
        })
    }

    /// The semaphore's name as stored (parts escaped and joined).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// How many permits may be in use at once.
    pub fn limit(&self) -> u32 {
        self.shared.limit
    }

    /// The Redis sorted set holding the permits (for inspection and tooling).
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// The pub/sub channel releases are announced on.
    pub fn channel(&self) -> &str {
        &self.shared.channel
    }

    /// Takes `n` permits if that many are free now; fails with [`LockError::Busy`](crate::LockError::Busy) at
    /// once otherwise. Lease: [`SemaphoreOptions::DEFAULT_LEASE`].
    pub async fn try_acquire(&self, n: u32) -> Result<Permits, LockError> {
        self.acquire(n, SemaphoreOptions::new().wait(Duration::ZERO))
            .await
    }

    /// Takes `n` permits, all or none, waiting up to the wait budget for enough of them
    /// to be free; see the type's docs for how waiting works.
    pub async fn acquire(&self, n: u32, options: SemaphoreOptions) -> Result<Permits, LockError> {
        self.check_count(n)?;
        let lease = options.lease.unwrap_or(SemaphoreOptions::DEFAULT_LEASE);
        check_lease("permit lease", lease)?;
        let wait = options.wait.unwrap_or(self.shared.client.config().wait);
        let span = wanted(
            || tracing::debug_span!("semaphore.acquire", semaphore = %self.name(), n, ?wait),
        );
        in_span(span, self.acquire_inner(n, lease, wait)).await
    }

    /// Permits free right now (expired ones count as free). A snapshot for inspection:
    /// it may be stale by the time it is read.
    pub async fn available(&self) -> Result<u32, LockError> {
        let free: i64 = self
            .shared
            .client
            .conn()
            .invoke("semaphore available", &SEMAPHORE_AVAILABLE, |c| {
                c.arg(1).arg(&self.shared.key).arg(self.shared.limit);
            })
            .await?;
        u32::try_from(free).map_err(|_| {
            LockError::UnexpectedReply(format!("semaphore_available.lua returned {free}"))
        })
    }

    fn check_count(&self, n: u32) -> Result<(), LockError> {
        let limit = self.shared.limit;
        if n == 0 {
            return Err(LockError::InvalidConfig(format!(
                "asked for 0 permits of semaphore `{}`; ask for at least one",
                self.name()
            )));
        }
        if n > limit {
            return Err(LockError::InvalidConfig(format!(
                "asked for {n} permits of semaphore `{}`, which has only {limit}; \
                 such a request could never be granted",
                self.name()
            )));
        }
        if n > MAX_PERMITS_PER_ACQUIRE {
            return Err(LockError::InvalidConfig(format!(
                "asked for {n} permits at once; at most {MAX_PERMITS_PER_ACQUIRE} per call"
            )));
        }
        Ok(())
    }

    async fn acquire_inner(
        &self,
        n: u32,
        lease: Duration,
        wait: Duration,
    ) -> Result<Permits, LockError> {
        if Handle::try_current().is_err() {
            return Err(LockError::InvalidConfig(
                "semaphore permits must be taken inside a tokio runtime".into(),
            ));
        }
        let inner = &self.shared.client;
        let started = Instant::now();
        let deadline = started.checked_add(wait).unwrap_or(started + MAX_LEASE);
        let listen = || Some(Listen::Hub(inner.hub(), self.shared.channel.as_str()));
        // The free permits this waiter saw last: none it could use yet.
        let seen_free = AtomicI64::new(i64::MAX);
        let turn = wait_for_turn(
            &inner.config().backoff,
            listen,
            deadline.into(),
            |_| async {
                Ok(match self.attempt(n, lease).await? {
                    Attempt::Granted(permits) => Turn::Done(permits),
                    Attempt::Busy { retry_after, free } => {
                        // A release wakes one local waiter: one that needs more than came
                        // back passes it on, once per rise in what it sees free (two big
                        // waiters would otherwise pass one free permit back and forth).
                        if free > seen_free.swap(free, Ordering::Relaxed) {
                            inner.hub().notify_local(&self.shared.channel);
                        }
                        Turn::Retry(retry_after)
                    }
                })
            },
        )
        .await?;
        match turn {
            Ok(permits) => {
                tracing::debug!(semaphore = %self.name(), n, waited = ?started.elapsed(), "permits granted");
                Ok(permits)
            }
            Err(retry_after) if wait.is_zero() => Err(LockError::Busy {
                key: self.shared.name.clone(),
                retry_after,
            }),
            Err(_) => {
                tracing::debug!(semaphore = %self.name(), ?wait, "semaphore wait timed out");
                Err(LockError::Timeout {
                    key: self.shared.name.clone(),
                    waited: started.elapsed(),
                })
            }
        }
    }

    /// One acquire script call with `n` fresh permit ids.
    async fn attempt(&self, n: u32, lease: Duration) -> Result<Attempt, LockError> {
        let inner = &self.shared.client;
        let ids: Vec<String> = (0..n)
            .map(|_| {
                let seq = NEXT_PERMIT.fetch_add(1, Ordering::Relaxed);
                format!("{}:{seq}", inner.id_hex())
            })
            .collect();
        // Until the reply says otherwise the script may have granted these ids.
        let mut pending = permits::Pending::new(self.clone(), ids);
        let sent = pending.ids();
        let start = Instant::now();
        let reply: Vec<i64> = inner
            .conn()
            .invoke("semaphore acquire", &SEMAPHORE_ACQUIRE, |c| {
                c.arg(1)
                    .arg(&self.shared.key)
                    .arg(self.shared.limit)
                    .arg(lease.as_millis() as u64);
                for id in sent {
                    c.arg(id);
                }
            })
            .await?;
        match reply[..] {
            [1, free] if free >= 0 => {
                if free > 0 {
                    // Only one local waiter is woken per release: pass the turn on.
                    inner.hub().notify_local(&self.shared.channel);
                }
                let ids = pending.disarm();
                Ok(Attempt::Granted(Permits::new(
                    self.clone(),
                    ids,
                    proven(start, lease),
                )))
            }
            [0, retry_ms, free] => {
                pending.disarm();
                Ok(Attempt::Busy {
                    retry_after: Duration::from_millis(retry_ms.max(1) as u64),
                    free,
                })
            }
            _ => Err(LockError::UnexpectedReply(format!(
                "semaphore_acquire.lua returned {reply:?}"
            ))),
        }
    }
}
