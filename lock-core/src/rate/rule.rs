//! A fixed-window rate rule with a lockout for keys that keep going over it.

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::client::store::key::LockName;
use crate::client::store::scripts::LIMIT_RULE;
use crate::error::LockError;
use crate::metrics::{self, RateOutcome};

/// At most `limit_count` calls per `seconds`; with `lock_count` set, a key that makes
/// more than `lock_count` calls in one window is locked out for `lock_time` (every call
/// refused, none counted), then starts a fresh window.
///
/// For example, an IP may pass 5 times a second, and more than 7 attempts lock it out
/// for 2 seconds:
///
/// ```no_run
/// # async fn demo(client: lock_core::LockClient) -> Result<(), lock_core::LockError> {
/// use lock_core::LimitRule;
///
/// let rule = LimitRule::new(1, 5).with_lockout(7, 2);
/// let d = client.limit_rule("ip", rule).try_access("10.0.0.1").await?;
/// println!("allowed: {}, locked out: {}", d.allowed, d.locked_out);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitRule {
    /// Window length in seconds.
    pub seconds: u32,
    /// Calls allowed per window.
    pub limit_count: u32,
    /// Calls per window past which the key is locked out (0: no lockout).
    pub lock_count: u32,
    /// Lockout length in seconds.
    pub lock_time: u32,
}

impl LimitRule {
    /// `limit_count` calls per `seconds`, no lockout.
    pub fn new(seconds: u32, limit_count: u32) -> Self {
        Self {
            seconds,
            limit_count,
            lock_count: 0,
            lock_time: 0,
        }
    }

    /// Past `lock_count` calls in one window, lock the key out for `lock_time` seconds.
    pub fn with_lockout(mut self, lock_count: u32, lock_time: u32) -> Self {
        self.lock_count = lock_count;
        self.lock_time = lock_time;
        self
    }

    fn validate(&self) -> Result<(), LockError> {
        let lockout_ok =
            self.lock_count == 0 || (self.lock_count >= self.limit_count && self.lock_time > 0);
        if self.seconds == 0 || !lockout_ok {
            return Err(LockError::InvalidConfig(format!(
                "limit rule {self:?}: the window must be at least 1 s, and a lockout needs \
                 lock_count >= limit_count and lock_time >= 1 s"
            )));
        }
        Ok(())
    }
}

/// One decision of a [`LimitRule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleDecision {
    /// The call passes.
    pub allowed: bool,
    /// Calls counted in the current window (0 while locked out).
    pub count: u32,
    /// When refused: until the window or the lockout ends.
    pub retry_after: Option<Duration>,
    /// The key is locked out (this call started the lockout, or it is under way).
    pub locked_out: bool,
}

/// A [`LimitRule`] bound to a client and a name; see [`LockClient::limit_rule`](crate::LockClient::limit_rule).
#[derive(Debug, Clone)]
pub struct RuleLimiter {
    client: Client,
    name: Arc<str>,
    rule: LimitRule,
}

impl RuleLimiter {
    pub(crate) fn new(client: Client, name: Arc<str>, rule: LimitRule) -> Self {
        Self { client, name, rule }
    }

    /// Counts one call of `key` and says whether it passes.
    pub async fn try_access<N: LockName>(&self, key: N) -> Result<RuleDecision, LockError> {
        self.rule.validate()?;
        let counter = self.client.prefixed_key(&self.name, &key, "window")?;
        let lockout = self.client.prefixed_key(&self.name, &key, "lockout")?;
        let reply: Vec<i64> = self
            .client
            .conn()
            .invoke("limit_rule", &LIMIT_RULE, |c| {
                c.arg(2)
                    .arg(&counter)
                    .arg(&lockout)
                    .arg(self.rule.seconds)
                    .arg(self.rule.limit_count)
                    .arg(self.rule.lock_count)
                    .arg(self.rule.lock_time);
            })
            .await?;
        match reply[..] {
            [allowed, count, retry_ms, locked] => {
                metrics::rate_limit(RateOutcome::of(allowed == 1));
                Ok(RuleDecision {
                    allowed: allowed == 1,
                    count: u32::try_from(count.max(0)).unwrap_or(u32::MAX),
                    retry_after: (allowed != 1)
                        .then(|| Duration::from_millis(retry_ms.max(0) as u64)),
                    locked_out: locked == 1,
                })
            }
            _ => Err(LockError::UnexpectedReply(format!(
                "limit_rule.lua returned {reply:?}"
            ))),
        }
    }
}
