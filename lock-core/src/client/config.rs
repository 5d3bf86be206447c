//! The client's configuration: namespace, leases, waiting, backoff, time limits.

use std::time::Duration;

use crate::client::store::key::{validate_delimiter, validate_namespace};
use crate::error::LockError;

/// Shortest lease accepted: below it a network round trip can eat the whole lease.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// Longest fixed lease accepted; hold longer with the watchdog, which renews for as long
/// as the guard lives.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a lock's lease lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Lease {
    /// The watchdog keeps renewing the lease (of [`LockConfig::watchdog_lease`]) every
    /// [`LockConfig::watchdog_period`] while the guard lives; a crashed holder's lock
    /// frees itself one lease later.
    Watchdog,
    /// The lock expires after this long unless released or extended first.
    Fixed(Duration),
}

/// Exponential backoff with full jitter: the n-th retry sleeps a uniformly random time
/// in `[0, min(max, initial * 2^n)]`. Waiters use it only as a fallback: they are woken
/// by the release message first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first sleep. Default 20 ms.
    pub initial: Duration,
    /// Upper bound of any sleep. Default 1 s.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(20),
            max: Duration::from_secs(1),
        }
    }
}

impl Backoff {
    /// The sleep before retry number `attempt` (0-based), jittered.
    pub fn delay(&self, attempt: u32) -> Duration {
        let cap = self
            .initial
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max);
        cap.mul_f64(fastrand::f64())
    }
}

/// Configuration of a [`LockClient`](crate::LockClient).
///
/// Behavior:
/// - Built with `LockConfig::new()` and by-value `with_*` setters; each setter documents
///   its default.
/// - Checked once when the client is built ([`LockConfig::validate`]); a bad value is an
///   [`LockError::InvalidConfig`] naming the setting.
///
/// ```
/// use std::time::Duration;
/// use lock_core::{Lease, LockConfig};
///
/// let config = LockConfig::new()
///     .with_namespace("shop:locks")
///     .with_lease(Lease::Fixed(Duration::from_secs(10)))
///     .with_wait(Duration::from_secs(2));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct LockConfig {
    pub(crate) namespace: String,
    pub(crate) delimiter: String,
    pub(crate) lease: Lease,
    pub(crate) watchdog_lease: Duration,
    pub(crate) watchdog_period: Option<Duration>,
    pub(crate) wait: Duration,
    pub(crate) backoff: Backoff,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) command_timeout: Duration,
    pub(crate) batching: bool,
    pub(crate) batches_in_flight: usize,
}

impl Default for LockConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl LockConfig {
    /// The defaults, as documented on each setter.
    pub fn new() -> Self {
        Self {
            namespace: "lock".into(),
            delimiter: ":".into(),
            lease: Lease::Watchdog,
            watchdog_lease: Duration::from_secs(30),
            watchdog_period: None,
            wait: Duration::from_secs(10),
            backoff: Backoff::default(),
            max_hold: None,
            command_timeout: Duration::from_secs(2),
            batching: true,
            batches_in_flight: usize::MAX,
        }
    }

    /// Prefix of every key and channel. Default `lock`. No braces, `%` or whitespace, and
    /// not ending in `:fence` (where the namespace before it keeps its fencing counters).
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Joins the parts of a lock name. Default `:`. Escaped inside parts.
    pub fn with_delimiter(mut self, delimiter: impl Into<String>) -> Self {
        self.delimiter = delimiter.into();
        self
    }

    /// Lease used when a call does not choose one. Default [`Lease::Watchdog`].
    pub fn with_lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// Lease the watchdog keeps renewing. Default 30 s.
    pub fn with_watchdog_lease(mut self, lease: Duration) -> Self {
        self.watchdog_lease = lease;
        self
    }

    /// How often the watchdog renews. Default a third of the watchdog lease; at most
    /// [`max_watchdog_period`](Self::max_watchdog_period), or
    /// [`validate`](Self::validate) refuses it.
    pub fn with_watchdog_period(mut self, period: Duration) -> Self {
        self.watchdog_period = Some(period);
        self
    }

    /// How long [`LockClient::lock`](crate::LockClient::lock) waits for a busy lock.
    /// Default 10 s.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// Fallback retry schedule of waiters. Default 20 ms doubling up to 1 s, full jitter.
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Longest time the watchdog keeps a lock; after it the lease runs out and the guard
    /// reports the lock lost. Default none (renew while the guard lives).
    pub fn with_max_hold(mut self, max_hold: Option<Duration>) -> Self {
        self.max_hold = max_hold;
        self
    }

    /// Limit on every single Redis call. Default 2 s.
    pub fn with_command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// Coalesce concurrent calls into one redis-rs call per batch. Default on.
    ///
    /// Lock releases, read-write holds taken and given back, GCRA decisions,
    /// idempotency claims and completions, and the acquisitions that need the acquire
    /// script (fenced ones, and a lock found busy)
    /// that arrive while an earlier call of the same kind (on the same hash slot) is in
    /// flight on this client's connection are sent together, as one script call over all
    /// their keys, as soon as the tasks already running have had their turn (or, with
    /// [`with_batches_in_flight`](Self::with_batches_in_flight) calls of that kind in
    /// flight, once one of them is back). The plain `SET NX PX` that takes a free lock
    /// queues the same way on a lane of plain commands, and queued ones go as one
    /// pipeline (Redis still runs each native `SET`; the client pays one call for
    /// many). A lone call goes at once: nothing waits for a timer, so an idle client
    /// sees no added latency, and a busy one spends far less per call, on both sides.
    /// (Once calls of a kind have queued, the next that finds nothing in flight queues
    /// too, so that the calls arriving with it join it, until a batch goes with no
    /// other call in it.) Each caller still gets its own reply or error.
    ///
    /// Turn it off to compare, or where every call must be its own command (a proxy
    /// that inspects scripts, commandstats kept per call). A queued call may wait for
    /// the batch ahead of it, so its time limit is twice the command timeout.
    pub fn with_batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// With batching on, the most batches of one kind (on one hash slot) in flight at
    /// once. Default: no limit; 0 counts as 1.
    ///
    /// Without a limit a batch goes as soon as the tasks already running have queued
    /// their calls, and what queued goes in a few parts (a quarter each, at least 16
    /// calls), so Redis runs one part while this client takes another's replies and
    /// writes the next: under load neither waits on the other. With 1, a batch takes
    /// all that queued (up to 128 calls) and goes only once the one before it is back:
    /// the fewest and biggest calls, but each side idles while the other works.
    ///
    /// ```
    /// use lock_core::LockConfig;
    ///
    /// let config = LockConfig::new().with_batches_in_flight(1);
    /// assert_eq!(config.batches_in_flight(), 1);
    /// ```
    pub fn with_batches_in_flight(mut self, n: usize) -> Self {
        self.batches_in_flight = n.max(1);
        self
    }

    /// The most batches of one kind in flight at once.
    pub fn batches_in_flight(&self) -> usize {
        self.batches_in_flight
    }

    /// The key namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The watchdog lease.
    pub fn watchdog_lease(&self) -> Duration {
        self.watchdog_lease
    }

    /// How long a waiter's mark outlives its last attempt: the longest sleep between
    /// two attempts and one call's time limit, so a waiter stays marked while it waits
    /// and a waiter that left (cancelled, crashed) is forgotten within this.
    pub(crate) fn waiter_linger(&self) -> Duration {
        self.backoff.max + self.command_timeout
    }

    /// The watchdog renewal period (a third of the lease unless set).
    pub fn watchdog_period(&self) -> Duration {
        self.watchdog_period.unwrap_or(self.watchdog_lease / 3)
    }

    /// The longest renewal period that can keep the watchdog lease: half of what the
    /// client counts on of it (the lease less its drift allowance), so that a renewal
    /// has the other half for its round trip and a retry after a failure.
    pub fn max_watchdog_period(&self) -> Duration {
        self.watchdog_lease
            .saturating_sub(drift(self.watchdog_lease))
            / 2
    }

    /// Checks every setting; [`LockClient`](crate::LockClient) constructors call it.
    pub fn validate(&self) -> Result<(), LockError> {
        validate_namespace(&self.namespace)?;
        validate_delimiter(&self.delimiter)?;
        check_lease("watchdog lease", self.watchdog_lease)?;
        check_max_hold(self.max_hold)?;
        if let Lease::Fixed(d) = self.lease {
            check_lease("default lease", d)?;
        }
        let period = self.watchdog_period();
        let bound = self.max_watchdog_period();
        if period.is_zero() || period > bound {
            return Err(LockError::InvalidConfig(format!(
                "watchdog period {period:?} must be above zero and at most {bound:?}, half \
                 of what the client can count on of the {:?} watchdog lease (the lease less \
                 its drift allowance): a renewal sent later may not be back, or retried, \
                 before the lease runs out (a third of the lease is usual)",
                self.watchdog_lease
            )));
        }
        // Upper bounds too: deadlines are sums and multiples of these (`Duration::MAX`
        // for "never" would overflow them).
        if self.backoff.initial.is_zero()
            || self.backoff.max < self.backoff.initial
            || self.backoff.max > MAX_LEASE
        {
            return Err(LockError::InvalidConfig(format!(
                "backoff needs initial > 0 and initial <= max <= {MAX_LEASE:?}"
            )));
        }
        if self.command_timeout.is_zero() || self.command_timeout > MAX_LEASE {
            return Err(LockError::InvalidConfig(format!(
                "command timeout {:?} must be above zero and at most {MAX_LEASE:?}",
                self.command_timeout
            )));
        }
        Ok(())
    }
}

/// The clock drift allowance subtracted from every lease the client counts on: 1% of
/// the lease plus 2 ms (the Redlock algorithm's, used for one node too: the client's and
/// the server's clocks may run at slightly different rates).
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// Until when a lease of `lease` asked for at `sent` (taken before the request left) is
/// known to last: the lease less the drift allowance. Works on any clock's instants.
pub(crate) fn proven<I: std::ops::Add<Duration, Output = I>>(sent: I, lease: Duration) -> I {
    sent + lease.saturating_sub(drift(lease))
}

/// A max-hold (`LockConfig::with_max_hold`, `LockOptions::max_hold`) of at least
/// [`MIN_LEASE`]: a shorter one would end every watched grant as it is taken.
pub(crate) fn check_max_hold(max_hold: Option<Duration>) -> Result<(), LockError> {
    match max_hold {
        Some(m) if m < MIN_LEASE => Err(LockError::InvalidConfig(format!(
            "max hold {m:?} is below {MIN_LEASE:?}: the watchdog would give up every grant as \
             it is taken (use None to renew while the guard lives)"
        ))),
        _ => Ok(()),
    }
}

pub(crate) fn check_lease(what: &str, lease: Duration) -> Result<(), LockError> {
    if lease < MIN_LEASE || lease > MAX_LEASE {
        return Err(LockError::InvalidConfig(format!(
            "{what} {lease:?} is outside {MIN_LEASE:?}..={MAX_LEASE:?}; for longer holds \
             use Lease::Watchdog"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = LockConfig::new();
        c.validate().unwrap();
        assert_eq!(c.namespace(), "lock");
        assert_eq!(c.watchdog_lease(), Duration::from_secs(30));
        assert_eq!(c.watchdog_period(), Duration::from_secs(10));
    }

    #[test]
    fn zero_and_absurd_leases_are_rejected() {
        for d in [Duration::ZERO, Duration::from_millis(9), MAX_LEASE * 2] {
            let e = LockConfig::new()
                .with_lease(Lease::Fixed(d))
                .validate()
                .unwrap_err();
            assert!(e.is_invalid_input() && e.to_string().contains("default lease"));
        }
        let e = LockConfig::new()
            .with_watchdog_period(Duration::from_secs(30))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("watchdog period"), "{e}");
    }

    #[test]
    fn a_watchdog_period_that_cannot_renew_in_time_is_refused_with_its_bound() {
        let lease = Duration::from_millis(300);
        let bound = LockConfig::new()
            .with_watchdog_lease(lease)
            .max_watchdog_period();
        assert_eq!(bound, Duration::from_micros(147_500));
        for period in [Duration::from_millis(296), bound + Duration::from_micros(1)] {
            let e = LockConfig::new()
                .with_watchdog_lease(lease)
                .with_watchdog_period(period)
                .validate()
                .unwrap_err();
            assert!(e.is_invalid_input(), "{e}");
            assert!(
                e.to_string().contains("147.5ms"),
                "the bound is not named: {e}"
            );
        }
        LockConfig::new()
            .with_watchdog_lease(lease)
            .with_watchdog_period(bound)
            .validate()
            .unwrap();
    }

    #[test]
    fn timeouts_too_long_to_add_up_are_refused() {
        let never = LockConfig::new().with_command_timeout(Duration::MAX);
        let e = never.validate().unwrap_err();
        assert!(e.to_string().contains("command timeout"), "{e}");
        let slow = LockConfig::new().with_backoff(Backoff {
            initial: Duration::from_millis(100),
            max: Duration::MAX,
        });
        assert!(slow.validate().unwrap_err().is_invalid_input());
        LockConfig::new()
            .with_command_timeout(MAX_LEASE)
            .with_backoff(Backoff {
                initial: Duration::from_millis(100),
                max: MAX_LEASE,
            })
            .validate()
            .unwrap();
    }

    #[test]
    fn backoff_is_capped_and_jittered() {
        let b = Backoff::default();
        for attempt in 0..40 {
            let cap = (b.initial * 2u32.pow(attempt.min(20))).min(b.max);
            assert!(b.delay(attempt) <= cap);
        }
        let samples: Vec<_> = (0..50).map(|_| b.delay(10)).collect();
        assert!(samples.iter().any(|d| *d != samples[0]), "no jitter");
    }
}
