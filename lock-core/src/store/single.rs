//! One Redis node (or a proxy in front of one): a reconnecting multiplexed connection.

use redis::aio::ConnectionManager;
use redis::{Cmd, ScriptInvocation};

use super::{Reply, Store};

pub(crate) struct SingleStore(pub(crate) ConnectionManager);

impl Store for SingleStore {
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        let mut c = self.0.clone();
        Box::pin(async move { cmd.query_async(&mut c).await })
    }

    fn invoke<'a>(&'a self, invocation: &'a ScriptInvocation<'a>) -> Reply<'a> {
        let mut c = self.0.clone();
        Box::pin(async move { invocation.invoke_async(&mut c).await })
    }

    fn group(&self, _key: &str) -> u16 {
        0
    }
}
