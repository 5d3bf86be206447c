//! The one place that talks to Redis: every script call, with its time limit.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, ScriptInvocation};

use crate::LockError;

/// The deployment a client talks to.
#[derive(Clone)]
enum Link {
    /// One node (or a proxy in front of one): a reconnecting multiplexed connection.
    Single(ConnectionManager),
    /// A Redis Cluster: commands go to the node that owns their keys' slot; MOVED/ASK
    /// redirections and failovers are followed by the cluster connection.
    Cluster(ClusterConnection),
}

/// A connection to one deployment plus the per-call time limit.
#[derive(Clone)]
pub(crate) struct Conn {
    link: Link,
    timeout: Duration,
}

impl Conn {
    pub(crate) fn single(manager: ConnectionManager, timeout: Duration) -> Self {
        Self {
            link: Link::Single(manager),
            timeout,
        }
    }

    pub(crate) fn cluster(conn: ClusterConnection, timeout: Duration) -> Self {
        Self {
            link: Link::Cluster(conn),
            timeout,
        }
    }

    /// True on a Redis Cluster: a multi-key script call must keep to one hash slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.link, Link::Cluster(_))
    }

    /// Runs a script invocation (EVALSHA, reloading on NOSCRIPT) within the time limit.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        op: &'static str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, LockError> {
        match &self.link {
            Link::Single(m) => {
                let mut c = m.clone();
                self.limit(op, invocation.invoke_async(&mut c)).await
            }
            Link::Cluster(cc) => {
                let mut c = cc.clone();
                self.limit(op, invocation.invoke_async(&mut c)).await
            }
        }
    }

    /// Runs one plain command within the time limit.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &Cmd,
    ) -> Result<T, LockError> {
        match &self.link {
            Link::Single(m) => self.limit(op, query(m.clone(), cmd)).await,
            Link::Cluster(cc) => self.limit(op, query(cc.clone(), cmd)).await,
        }
    }

    async fn limit<T>(
        &self,
        op: &'static str,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(reply) => Ok(reply?),
            Err(_) => Err(LockError::RedisTimeout {
                op,
                after: self.timeout,
            }),
        }
    }
}

async fn query<C: ConnectionLike, T: FromRedisValue>(mut c: C, cmd: &Cmd) -> redis::RedisResult<T> {
    cmd.query_async(&mut c).await
}
