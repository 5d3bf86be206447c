//! The two deployments behind [`Store`]: one node (or a proxy in front of one), on a
//! connection of our own ([`Wire`]) or, where that cannot speak to it (TLS, RESP3) or
//! the user handed one in, a reconnecting multiplexed `ConnectionManager`; and a Redis
//! Cluster, on the redis-rs cluster connection (commands go to the node that owns their
//! keys' slot). A redis-rs connection is made again when its runtime ends ([`Homed`]); a
//! [`Wire`] opens a new link by itself. They differ
//! in how keys group into one script call, in what is sent again (nothing on one node;
//! on a Cluster, a call the cluster refused without running it: MOVED/ASK redirections,
//! failovers in progress; never one whose reply was lost), and in how a pipeline goes
//! (on a Cluster, its commands each on its own, so each follows its own redirection).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisResult, Value};

use super::args::{Args, Pipe};
use super::key::cluster_slot;
use super::wire::Wire;
use crate::client::homed::{Homed, Make};

/// A redis-rs connection, made again when its runtime ends.
pub(crate) struct RedisStore<C> {
    conn: Homed<C>,
}

/// A Redis deployment: what the rest of the crate needs from one is to run a command
/// (a script call is an `EVALSHA`/`EVAL` command), a pipeline of plain commands, or a
/// script invocation, and to say which keys may share one script call ([`group`]).
///
/// An enum, not a trait object: a call on one node, the common case, is awaited in
/// place, with no boxed future per call.
///
/// [`group`]: Store::group
pub(crate) enum Store {
    /// One node, on a connection of our own.
    Node(RedisStore<Wire>),
    /// One node, on a redis-rs `ConnectionManager`.
    Managed(RedisStore<ConnectionManager>),
    Cluster(RedisStore<ClusterConnection>),
}

impl Store {
    /// Runs one command (copied as it is onto a [`Wire`], as a redis-rs `Cmd` to the
    /// others).
    pub(crate) async fn query(&self, cmd: &Args) -> RedisResult<Value> {
        match self {
            Self::Node(node) => node.query(cmd).await,
            Self::Managed(node) => Box::pin(node.query(&cmd.to_cmd())).await,
            Self::Cluster(cluster) => Box::pin(cluster.query(&cmd.to_cmd())).await,
        }
    }

    /// Runs `pipe` (every key in one [`group`]) in one write, as a pipeline (not a
    /// transaction): each command's own reply or error, or an error of the whole call.
    ///
    /// [`group`]: Store::group
    pub(crate) async fn pipeline(&self, pipe: &Pipe<'_>) -> RedisResult<Vec<RedisResult<Value>>> {
        match self {
            Self::Node(node) => node.pipeline(pipe).await,
            Self::Managed(node) => Box::pin(node.pipeline(&pipe.to_pipeline())).await,
            Self::Cluster(cluster) => Box::pin(cluster.pipeline(&pipe.to_pipeline())).await,
        }
    }

    /// Which keys may go into one multi-key script call: the key's hash slot on a
    /// Cluster, the same group for every key on one node.
    pub(crate) fn group(&self, key: &str) -> u16 {
        match self {
            Self::Node(_) | Self::Managed(_) => 0,
            Self::Cluster(_) => cluster_slot(key),
        }
    }
}

impl<C: Clone + Send + Sync + 'static> RedisStore<C> {
    /// A store on `conn`; `make`, when known, makes a new connection like it (see
    /// [`Homed`]).
    pub(crate) fn new(conn: C, make: Option<Make<C>>) -> Self {
        Self {
            conn: Homed::new(conn, make),
        }
    }
}

impl RedisStore<Wire> {
    async fn query(&self, cmd: &Args) -> RedisResult<Value> {
        self.conn
            .call(move |c| async move { c.query(cmd).await })
            .await
    }

    async fn pipeline(&self, pipe: &Pipe<'_>) -> RedisResult<Vec<RedisResult<Value>>> {
        self.conn
            .call(move |c| async move {
                let replies = c.pipeline(pipe).await?;
                Ok(replies.into_iter().map(own_reply).collect())
            })
            .await
    }
}

impl RedisStore<ConnectionManager> {
    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.conn
            .call(move |mut c| async move { cmd.query_async(&mut c).await })
            .await
    }

    async fn pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<RedisResult<Value>>> {
        self.conn
            .call(move |mut c| async move {
                let replies = c.req_packed_commands(pipe, 0, pipe.len()).await?;
                Ok(replies.into_iter().map(own_reply).collect())
            })
            .await
    }
}

/// A pipelined command's reply: an error reply is that command's error.
fn own_reply(v: Value) -> RedisResult<Value> {
    match v {
        Value::ServerError(e) => Err(e.into()),
        v => Ok(v),
    }
}

/// Times a call refused by the cluster is sent again, and the first pause between.
const RESENDS: u32 = 5;
const FIRST_PAUSE: Duration = Duration::from_millis(10);

/// Whether `e` proves the command never ran, so sending it again cannot run it twice:
/// the node refused it (a redirection, a cluster or master down, a replica that was a
/// master, a node loading its data) or it was never sent (no connection to the node).
/// A connection lost after the command was written proves nothing, and is never resent.
fn never_ran(e: &RedisError) -> bool {
    use redis::ServerErrorKind as S;
    match e.kind() {
        ErrorKind::Server(
            S::Moved
            | S::Ask
            | S::TryAgain
            | S::ClusterDown
            | S::MasterDown
            | S::ReadOnly
            | S::BusyLoading,
        ) => true,
        ErrorKind::ClusterConnectionNotFound => true,
        _ => e.is_connection_refusal(),
    }
}

/// Sends `call` until it is answered, or fails in a way that does not prove the command
/// never ran, or [`RESENDS`] resends are used. The cluster connection is built without
/// its own retries (it would also resend after a lost reply: a `SET NX` would then find
/// its own value, a release report `Expired`, a rate-limit check count twice), so the
/// redirections and refusals it would have followed are followed here.
async fn resend_refused<F, Fut, T>(mut call: F) -> RedisResult<T>
where
    F: FnMut(Option<(String, u16)>) -> Fut,
    Fut: std::future::Future<Output = RedisResult<T>>,
{
    let mut ask = None;
    let mut resend = 0;
    loop {
        let e = match call(ask.take()).await {
            Err(e) if resend < RESENDS && never_ran(&e) => e,
            other => return other,
        };
        if e.kind() == ErrorKind::Server(redis::ServerErrorKind::Ask) {
            // The key is moving: this one call goes to the importing node, at once.
            ask = e.redirect_node().and_then(|(addr, _)| {
                let (host, port) = addr.rsplit_once(':')?;
                Some((host.to_owned(), port.parse().ok()?))
            });
            if ask.is_some() {
                resend += 1;
                continue;
            }
        }
        // The connection refreshes its slot map on a redirection; give it a moment.
        tokio::time::sleep(FIRST_PAUSE * 2u32.pow(resend)).await;
        resend += 1;
    }
}

impl RedisStore<ClusterConnection> {
    async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        resend_refused(move |ask| {
            self.conn.call(move |mut c| async move {
                match ask {
                    None => cmd.query_async(&mut c).await,
                    Some((host, port)) => {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").add_command(cmd.clone());
                        let route = SingleNodeRoutingInfo::ByAddress { host, port };
                        // Offset 1: the reply taken is the command's, after ASKING's
                        // `+OK` (taking one reply of two would hand the other to the
                        // next call on the connection). An error reply is the call's
                        // error, as `query_async` answers it (a NOSCRIPT there loads
                        // the script).
                        let mut replies = c.route_pipeline(pipe, 1, 1, route).await?;
                        replies
                            .pop()
                            .ok_or_else(|| {
                                RedisError::from((ErrorKind::Client, "an empty reply to ASKING"))
                            })?
                            .extract_error()
                    }
                }
            })
        })
        .await
    }

    async fn pipeline(&self, pipe: &Pipeline) -> RedisResult<Vec<RedisResult<Value>>> {
        // Each command on its own, all at once on the node's one connection: redis-rs
        // fails a whole Cluster pipeline when one reply is a redirection (a slot that
        // moved or is moving) and drops the others' replies, so which commands ran
        // would be unknown, and sending the pipeline again would run some twice. Alone,
        // each follows its own redirection and runs once.
        Ok(futures_util::future::join_all(pipe.cmd_iter().map(|cmd| self.query(cmd))).await)
    }
}
