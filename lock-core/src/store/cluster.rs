//! A Redis Cluster: commands go to the node that owns their keys' slot; MOVED/ASK
//! redirections and failovers are followed by the redis-rs cluster connection.

use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ScriptInvocation};

use super::key::cluster_slot;
use super::{Reply, Store};

pub(crate) struct ClusterStore(pub(crate) ClusterConnection);

impl Store for ClusterStore {
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        let mut c = self.0.clone();
        Box::pin(async move { cmd.query_async(&mut c).await })
    }

    fn invoke<'a>(&'a self, invocation: &'a ScriptInvocation<'a>) -> Reply<'a> {
        let mut c = self.0.clone();
        Box::pin(async move { invocation.invoke_async(&mut c).await })
    }

    fn group(&self, key: &str) -> u16 {
        cluster_slot(key)
    }
}
