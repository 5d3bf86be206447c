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
        let reply: Vec<i64> = conn
            .call(&GCRA, &k, |e| {
                e.key(&k)
                    .arg(self.limit.emission_interval().as_micros() as u64)
                    .arg(self.limit.burst)
                    .arg(cost)
            })
            .await?;
        let us = |v: i64| Duration::from_micros(v.max(0) as u64);
        match reply[..] {
            [allowed, remaining, retry_us, reset_us] => {
                if cost > 0 {
                    // A peek (cost 0) decides nothing.
                    metrics::rate_limit(RateOutcome::of(allowed == 1));
                }
                Ok(Decision {
                    allowed: allowed == 1,
                    remaining: u32::try_from(remaining.max(0)).unwrap_or(u32::MAX),
                    retry_after: (allowed != 1).then(|| us(retry_us)),
                    reset_after: us(reset_us),
                    limit: self.limit,
                })
            }
            _ => Err(LockError::UnexpectedReply(format!(
                "gcra.lua returned {reply:?}"
            ))),
        }
    }
}
