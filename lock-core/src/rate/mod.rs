//! Rate limiting on Redis: GCRA ([`RateLimiter`]) and a fixed-window rule with a
//! lockout ([`LimitRule`]).

mod rule;

use std::sync::Arc;
use std::time::Duration;

pub use rule::{LimitRule, RuleDecision, RuleLimiter};

use crate::client::Client;
use crate::client::store::Args;
use crate::client::store::key::LockName;
use crate::client::store::scripts::GCRA;
use crate::error::LockError;
use crate::metrics::{self, RateOutcome};

/// A quota: `rate` requests per `period`, with up to `burst` at once.
///
/// ```
/// use std::time::Duration;
/// use lock_core::RateLimit;
///
/// let per_ip = RateLimit::per_second(5).with_burst(10);
/// let sms = RateLimit::new(1, Duration::from_secs(60));
/// assert_eq!(per_ip.emission_interval(), Duration::from_millis(200));
/// # let _ = sms;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    rate: u32,
    period: Duration,
    burst: u32,
}

impl RateLimit {
    /// `rate` requests per `period`; the burst defaults to `rate` (a full period's
    /// worth may arrive at once).
    pub fn new(rate: u32, period: Duration) -> Self {
        Self {
            rate,
            period,
            burst: rate,
        }
    }

    /// `rate` per second.
    pub fn per_second(rate: u32) -> Self {
        Self::new(rate, Duration::from_secs(1))
    }

    /// `rate` per minute.
    pub fn per_minute(rate: u32) -> Self {
        Self::new(rate, Duration::from_secs(60))
    }

    /// How many requests may arrive at once. Default: the rate.
    pub fn with_burst(mut self, burst: u32) -> Self {
        self.burst = burst;
        self
    }

    /// Requests per period.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The period.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// The burst.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// The steady spacing between requests: `period / rate`.
    pub fn emission_interval(&self) -> Duration {
        self.period / self.rate.max(1)
    }

    fn validate(&self) -> Result<(), LockError> {
        if self.rate == 0 || self.burst == 0 {
            return Err(LockError::InvalidConfig(format!(
                "rate limit {self:?}: rate and burst must be at least 1"
            )));
        }
        if self.emission_interval() < Duration::from_micros(1) || self.period > crate::MAX_LEASE {
            return Err(LockError::InvalidConfig(format!(
                "rate limit {self:?}: the period must be at most 24 h and at least 1 µs per \
                 request"
            )));
        }
        // `gcra.lua` keeps times as microseconds in Lua numbers (doubles): a key's
        // furthest arrival time, a whole burst ahead of now, must stay exact.
        if u128::from(interval_us(self)) * u128::from(self.burst) > 1 << 52 {
            return Err(LockError::InvalidConfig(format!(
                "rate limit {self:?}: the burst times the spacing must be at most 2^52 µs \
                 (about 142 years)"
            )));
        }
        Ok(())
    }
}

/// One rate-limit decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The request fits (and was counted, unless this was a peek).
    pub allowed: bool,
    /// Requests of cost 1 that would still fit right now.
    pub remaining: u32,
    /// When refused: how long until the same request would fit.
    pub retry_after: Option<Duration>,
    /// How long until the key is back to a full burst.
    pub reset_after: Duration,
    /// The quota this was decided against.
    pub limit: RateLimit,
}

/// A GCRA rate limiter (the semantics of redis-cell and go-redis `redis_rate`), one
/// atomic script per decision on the Redis server's clock.
///
/// Behavior:
/// - Every key has its own quota state; processes sharing the Redis share the limit.
/// - [`check`](Self::check) counts one request, [`check_n`](Self::check_n) a cost of n,
///   [`peek`](Self::peek) decides without counting, [`reset`](Self::reset) forgets a key.
/// - A refused request is not counted.
///
/// ```no_run
/// # async fn demo(client: lock_core::LockClient) -> Result<(), lock_core::LockError> {
/// use lock_core::RateLimit;
///
/// let limiter = client.rate_limiter("login", RateLimit::per_second(5).with_burst(5));
/// let d = limiter.check("10.0.0.1").await?;
/// if !d.allowed {
///     println!("slow down, retry in {:?}", d.retry_after);
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimiter {
    client: Client,
    name: Arc<str>,
    limit: RateLimit,
}

impl RateLimiter {
    pub(crate) fn new(client: Client, name: Arc<str>, limit: RateLimit) -> Self {
        Self {
            client,
            name,
            limit,
        }
    }

    /// The quota.
    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Decides one request for `key` and counts it if allowed.
    pub async fn check<N: LockName>(&self, key: N) -> Result<Decision, LockError> {
        self.decide(&key, 1).await
    }

    /// Decides a request of cost `n` (n units of the quota at once).
    pub async fn check_n<N: LockName>(&self, key: N, n: u32) -> Result<Decision, LockError> {
        if n == 0 || n > self.limit.burst {
            return Err(LockError::InvalidConfig(format!(
                "cost {n} must be between 1 and the burst {}; a larger cost could never pass",
                self.limit.burst
            )));
        }
        self.decide(&key, n).await
    }

    /// What a request of cost 1 would get, without counting anything: `allowed` is
    /// what the next [`check`](Self::check) would say, and `remaining` counts that
    /// request too.
    pub async fn peek<N: LockName>(&self, key: N) -> Result<Decision, LockError> {
        self.decide(&key, 0).await
    }

    /// Forgets `key`'s state: it starts again with a full burst.
    pub async fn reset<N: LockName>(&self, key: N) -> Result<(), LockError> {
        let k = self.client.prefixed_key(&self.name, &key, "gcra")?;
        let _: i64 = self
            .client
            .conn()
            .query("rate_reset", Args::cmd("DEL").arg(k))
            .await?;
        Ok(())
    }

    async fn decide<N: LockName + ?Sized>(
        &self,
        key: &N,
        cost: u32,
    ) -> Result<Decision, LockError> {
        self.limit.validate()?;
        let k = self.client.prefixed_key(&self.name, key, "gcra")?;
        let conn = self.client.conn();
        let interval = interval_us(&self.limit);
        let reply: i64 = conn
            .call(&GCRA, &k, |e| {
                e.key(&k).arg(interval).arg(self.limit.burst).arg(cost)
            })
            .await?;
        let decision = decision(reply, self.limit, cost);
        if cost > 0 {
            // A peek (cost 0) decides nothing.
            metrics::rate_limit(RateOutcome::of(decision.allowed));
        }
        Ok(decision)
    }
}

/// The emission interval as `gcra.lua` is given it: whole microseconds, rounded up (at
/// least 1, as [`RateLimit::validate`] requires), so a rounded quota is never more than
/// the one asked for.
fn interval_us(limit: &RateLimit) -> u64 {
    let per_request = u128::from(limit.rate.max(1)) * 1_000;
    u64::try_from(limit.period.as_nanos().div_ceil(per_request)).unwrap_or(u64::MAX)
}

/// The decision `gcra.lua` answered with `reply` (see the script: the key's backlog
/// before the request, `-1 - backlog` if refused) for a request of `cost` (0: a peek
/// of cost 1) under `limit`: the same arithmetic the script decided with, in integers.
fn decision(reply: i64, limit: RateLimit, cost: u32) -> Decision {
    let allowed = reply >= 0;
    let backlog = i128::from(if allowed { reply } else { -1 - reply });
    let interval = i128::from(interval_us(&limit));
    let burst_offset = interval * i128::from(limit.burst);
    let probe = i128::from(cost.max(1));
    let us = |v: i128| Duration::from_micros(u64::try_from(v.max(0)).unwrap_or(u64::MAX));
    let (remaining, retry_after, reset_after) = if !allowed {
        (
            0,
            Some(us(backlog + interval * probe - burst_offset)),
            backlog,
        )
    } else {
        // Counted, the request moved the TAT on; a peek left it where it was.
        let after = backlog + interval * i128::from(cost);
        ((burst_offset - after) / interval, None, after)
    };
    Decision {
        allowed,
        remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
        retry_after,
        reset_after: us(reset_after),
        limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The decision as GCRA defines it (redis-cell's allowed, remaining, retry-after and
    /// reset-after), computed from the key's TAT in floats, as a Lua script would: the
    /// model `decision` must agree with.
    fn model(tat_ahead: i64, limit: RateLimit, cost: u32) -> Decision {
        let now = 1_795_000_000_000_000_f64;
        let interval = interval_us(&limit) as f64;
        let tat = now + tat_ahead as f64;
        let burst_offset = interval * f64::from(limit.burst);
        let probe = f64::from(cost.max(1));
        let new_tat = tat + interval * probe;
        let diff = now - (new_tat - burst_offset);
        let us = |v: f64| Duration::from_micros(v.max(0.0) as u64);
        let (allowed, remaining, retry, reset) = if diff < 0.0 {
            (
                false,
                0.0,
                Some(us(new_tat - burst_offset - now)),
                tat - now,
            )
        } else if cost == 0 {
            (true, (diff / interval).floor() + 1.0, None, tat - now)
        } else {
            (true, (diff / interval).floor(), None, new_tat - now)
        };
        Decision {
            allowed,
            remaining: remaining as u32,
            retry_after: retry,
            reset_after: us(reset),
            limit,
        }
    }

    /// The script's one-number reply for a key whose TAT is `tat_ahead` microseconds
    /// past now (the script clamps a TAT in the past to now).
    fn reply(tat_ahead: i64, limit: RateLimit, cost: u32) -> i64 {
        let interval = interval_us(&limit) as i64;
        let burst = i64::from(limit.burst);
        if tat_ahead + interval * i64::from(cost.max(1)) > interval * burst {
            -1 - tat_ahead
        } else {
            tat_ahead
        }
    }

    #[test]
    fn the_backlog_alone_gives_every_field_of_the_decision() {
        let mut rng = fastrand::Rng::with_seed(23);
        for _ in 0..20_000 {
            let limit = RateLimit::new(
                rng.u32(1..=1000),
                Duration::from_millis(rng.u64(1..=60_000)),
            )
            .with_burst(rng.u32(1..=50));
            let interval = interval_us(&limit) as i64;
            let cost = rng.u32(0..=limit.burst());
            let tat_ahead = rng.i64(0..=interval * i64::from(limit.burst()) + interval);
            let got = decision(reply(tat_ahead, limit, cost), limit, cost);
            assert_eq!(
                got,
                model(tat_ahead, limit, cost),
                "{limit:?} cost {cost} ahead {tat_ahead}"
            );
        }
    }

    #[test]
    fn a_burst_too_far_ahead_for_the_scripts_clock_is_refused() {
        let far = RateLimit::new(1, Duration::from_secs(86_400)).with_burst(u32::MAX);
        let e = far.validate().unwrap_err();
        assert!(e.to_string().contains("2^52"), "{e}");
        // A thousand days of a daily quota at once is fine.
        let daily = RateLimit::new(1, Duration::from_secs(86_400)).with_burst(1_000);
        daily.validate().unwrap();
    }

    #[test]
    fn edges_of_the_burst() {
        let limit = RateLimit::per_second(10).with_burst(2);
        // An empty key: the whole burst, one of it taken.
        let d = decision(0, limit, 1);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.retry_after), (1, None));
        assert_eq!(d.reset_after, Duration::from_millis(100));
        // A peek on an empty key counts itself in what remains.
        assert_eq!(decision(0, limit, 0).remaining, 2);
        // Refused with the burst used up: retry when one interval has passed.
        let d = decision(-1 - 200_000, limit, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Some(Duration::from_millis(100)));
        assert_eq!(d.reset_after, Duration::from_millis(200));
    }
}
