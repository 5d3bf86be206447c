//! The two deployments behind [`Store`]: one node (or a proxy in front of one), on a
//! reconnecting multiplexed `ConnectionManager`, and a Redis Cluster, on the redis-rs
//! cluster connection (commands go to the node that owns their keys' slot; MOVED/ASK
//! redirections and failovers are followed by it). They differ only in how keys group
//! into one script call.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ScriptInvocation};

use super::key::cluster_slot;
use super::{Reply, Store};

/// A redis-rs connection as a [`Store`]; `cluster` says whether keys must keep to one
/// hash slot per script call.
pub(crate) struct RedisStore<C> {
    conn: C,
    cluster: bool,
}

impl RedisStore<ConnectionManager> {
    pub(crate) fn single(conn: ConnectionManager) -> Self {
        Self {
            conn,
            cluster: false,
        }
    }
}

impl RedisStore<ClusterConnection> {
    pub(crate) fn cluster(conn: ClusterConnection) -> Self {
        Self {
            conn,
            cluster: true,
        }
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        let mut c = self.conn.clone();
        Box::pin(async move { cmd.query_async(&mut c).await })
    }

    fn invoke<'a>(&'a self, invocation: &'a ScriptInvocation<'a>) -> Reply<'a> {
        let mut c = self.conn.clone();
        Box::pin(async move { invocation.invoke_async(&mut c).await })
    }

    fn group(&self, key: &str) -> u16 {
        if self.cluster { cluster_slot(key) } else { 0 }
    }
}
