//! `LockClient`'s doors to the capabilities on the same Redis: each hands the
//! capability this client's [`Client`](crate::client::Client) (connection, hub, id,
//! namespace) and nothing of the lock engine. The one place where the facade names
//! them, so the capabilities never import the facade.

use redis::ToRedisArgs;

use super::LockClient;
use crate::client::store::key::LockName;
use crate::error::LockError;
use crate::fencing::{self, FencedWrite};
use crate::idempotency::{IdempotencyStore, OneTimeTokens};
use crate::ids::{IdConfig, IdGenerator};
use crate::owner::FencingToken;
use crate::rate::{LimitRule, RateLimit, RateLimiter, RuleLimiter};
use crate::semaphore::Semaphore;

impl LockClient {
    /// A GCRA limiter named `name` (the first part of its keys) enforcing `limit`.
    pub fn rate_limiter(&self, name: impl Into<String>, limit: RateLimit) -> RateLimiter {
        RateLimiter::new(self.client().clone(), name.into().into(), limit)
    }

    /// A limiter applying `rule` to each key under `name`; see [`LimitRule`].
    pub fn limit_rule(&self, name: impl Into<String>, rule: LimitRule) -> RuleLimiter {
        RuleLimiter::new(self.client().clone(), name.into().into(), rule)
    }

    /// A handle on the distributed semaphore `name` with `permits` permits (see
    /// [`Semaphore`]). Cheap: nothing is sent to Redis until a permit is asked for.
    ///
    /// Every user of one name must pass the same `permits`. Fails with
    /// [`LockError::InvalidConfig`] for zero permits and [`LockError::InvalidKey`] for a
    /// bad name.
    pub fn semaphore<N: LockName>(&self, name: N, permits: u32) -> Result<Semaphore, LockError> {
        Semaphore::new(self.client().clone(), name, permits)
    }

    /// The idempotency store named `name` (the first part of its keys). Cheap: nothing
    /// is sent to Redis until a key is claimed.
    pub fn idempotency_store(&self, name: impl Into<String>) -> IdempotencyStore {
        IdempotencyStore::new(self.client().clone(), name.into())
    }

    /// One-time tokens named `name` (the first part of their keys).
    pub fn one_time_tokens(&self, name: impl Into<String>) -> OneTimeTokens {
        OneTimeTokens::new(self.client().clone(), name.into())
    }

    /// Stores `value` for `resource` unless a write with a newer fencing token came
    /// first, or one with the same token from another holder (the script
    /// `lua/fenced_write.lua`). The same holder may write again with its token.
    ///
    /// `value` must be exactly one Redis argument (a string, a number, bytes): a value
    /// that makes none or several is refused with [`LockError::InvalidConfig`] before
    /// anything is written, and the token stays usable.
    pub async fn fenced_write<N: LockName, V: ToRedisArgs>(
        &self,
        resource: N,
        token: FencingToken,
        value: V,
    ) -> Result<FencedWrite, LockError> {
        fencing::fenced_write(self.client(), resource, token, value).await
    }

    /// The value last stored with [`fenced_write`](Self::fenced_write) for `resource`.
    pub async fn fenced_read<N: LockName>(
        &self,
        resource: N,
    ) -> Result<Option<Vec<u8>>, LockError> {
        fencing::fenced_read(self.client(), resource).await
    }
}

impl IdGenerator {
    /// A generator of ids named `name` (any [`LockName`]) on `client`'s Redis, under the
    /// client's namespace and delimiter.
    pub fn new<N: LockName>(
        client: &LockClient,
        name: N,
        config: IdConfig,
    ) -> Result<Self, LockError> {
        Self::on(client.client().clone(), name, config)
    }
}
