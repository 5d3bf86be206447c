//! The one place that talks to Redis: every script call, with its time limit.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Cmd, FromRedisValue, ScriptInvocation};

use crate::LockError;

/// A reconnecting multiplexed connection plus the per-call time limit.
#[derive(Clone)]
pub(crate) struct Conn {
    manager: ConnectionManager,
    timeout: Duration,
}

impl Conn {
    pub(crate) fn new(manager: ConnectionManager, timeout: Duration) -> Self {
        Self { manager, timeout }
    }

    /// Runs a script invocation (EVALSHA, reloading on NOSCRIPT) within the time limit.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        op: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        let mut conn = self.manager.clone();
        match tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn)).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(LockError::RedisTimeout {
                op,
                after: self.timeout,
            }),
        }
    }

    /// Runs one plain command within the time limit.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &Cmd,
    ) -> Result<T, LockError> {
        let mut conn = self.manager.clone();
        match tokio::time::timeout(self.timeout, cmd.query_async(&mut conn)).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(LockError::RedisTimeout {
                op,
                after: self.timeout,
            }),
        }
    }
}
