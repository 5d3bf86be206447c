//! The seam to a Redis deployment: the one place that talks to Redis.
//!
//! [`Store`] is a deployment (what the crate asks of one is on its type): one node (a
//! connection of our own, [`wire`], or a reconnecting `ConnectionManager`) or a Redis Cluster (redis-rs `cluster-async`),
//! each a [`RedisStore`], made again when the runtime it was made on ends. [`Conn`]
//! wraps a store with the per-call time limit (kept by [`deadline`], with no timer per
//! call) and typed replies; the watchdog's batching, the waiting loop and the Redlock
//! fan-out are written once against it.

mod args;
pub(crate) mod batch;
mod deadline;
mod deployment;
mod entry;
pub mod key;
pub(crate) mod scripts;
pub(crate) mod version;
pub(crate) mod wire;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use redis::{FromRedisValue, RedisResult, Value};

use crate::error::LockError;
use deadline::{Deadlines, Elapsed, Limit, Within};

pub(crate) use args::{Args, Pipe};

pub(crate) use deployment::{RedisStore, Store};

/// A store plus the per-call time limit; cheap to clone.
#[derive(Clone)]
pub(crate) struct Conn {
    store: Arc<Store>,
    deadlines: Deadlines,
    /// The batch lanes; `None` with batching off.
    lanes: Option<Arc<batch::Lanes>>,
}

impl Conn {
    /// `batches_in_flight`: `None` with batching off, else the most calls of one lane in
    /// flight at once.
    pub(crate) fn new(store: Store, timeout: Duration, batches_in_flight: Option<usize>) -> Self {
        Self {
            store: Arc::new(store),
            deadlines: Deadlines::new(timeout),
            lanes: batches_in_flight.map(|depth| Arc::new(batch::Lanes::new(depth))),
        }
    }

    /// The configured per-call time limit.
    pub(crate) fn timeout(&self) -> Duration {
        self.deadlines.after(Limit::Call)
    }

    /// The batch group of `key` (see [`Store::group`]).
    pub(crate) fn group(&self, key: &str) -> u16 {
        self.store.group(key)
    }

    /// Runs `script` (see [`eval`](Self::eval)) within the time limit, its reply read
    /// as a `T`; `op` names the call in errors.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        op: &'static str,
        script: &scripts::Lua,
        fill: impl Fn(&mut Args),
    ) -> Result<T, LockError> {
        let value = self.eval(script, self.timeout(), fill).await?;
        decode(op, value)
    }

    /// Runs one plain command within the time limit.
    pub(crate) async fn query<T: FromRedisValue>(
        &self,
        op: &'static str,
        cmd: &Args,
    ) -> Result<T, LockError> {
        let value = timed(op, self.within(self.store.query(cmd)).await)?;
        decode(op, value)
    }

    /// Runs `pipe` in one write within the time limit: each command's reply or error.
    pub(crate) async fn pipeline(
        &self,
        pipe: &Pipe<'_>,
    ) -> Result<Vec<RedisResult<Value>>, LockError> {
        timed("pipeline", self.within(self.store.pipeline(pipe)).await)
    }

    /// Runs `script` with the keys and arguments `fill` appends (`numkeys` first), as
    /// `EVALSHA`, and as `EVAL` of the source if the server lost the script (restart,
    /// `SCRIPT FLUSH`); within `within` (at most the configured time limit).
    pub(crate) async fn eval(
        &self,
        script: &scripts::Lua,
        within: Duration,
        fill: impl Fn(&mut Args),
    ) -> Result<Value, LockError> {
        self.eval_sized(script, within, (4, 64), fill).await
    }

    /// [`eval`](Self::eval) of a call whose `fill` writes about `size.0` arguments of
    /// `size.1` bytes in all: its command is allocated once.
    pub(crate) async fn eval_sized(
        &self,
        script: &scripts::Lua,
        within: Duration,
        size: (usize, usize),
        fill: impl Fn(&mut Args),
    ) -> Result<Value, LockError> {
        let mut cmd = Args::with_capacity(size.0 + 2, size.1 + 56);
        cmd.arg("EVALSHA").arg(script.sha());
        fill(&mut cmd);
        self.eval_command(script, within, cmd).await
    }

    /// Runs `evalsha` (`EVALSHA <sha of script> ...`), and as `EVAL` of the source
    /// with the same arguments if the server lost the script; within `within` (at most
    /// the configured time limit).
    pub(crate) async fn eval_command(
        &self,
        script: &scripts::Lua,
        within: Duration,
        evalsha: Args,
    ) -> Result<Value, LockError> {
        let call = async {
            match self.store.query(&evalsha).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // Rare (a restart, `SCRIPT FLUSH`): boxed, so every call's future
                    // stays the size of one query.
                    Box::pin(self.eval_source(script, &evalsha)).await
                }
                other => other,
            }
        };
        timed(
            script.op(),
            self.deadlines.within_at_most(within, call).await,
        )
    }

    /// `call` within the configured time limit.
    fn within<F: Future>(&self, call: F) -> Within<'_, F> {
        self.deadlines.within(Limit::Call, call)
    }

    /// `evalsha` sent again as `EVAL` of `script`'s source, with the same arguments.
    async fn eval_source(&self, script: &scripts::Lua, evalsha: &Args) -> RedisResult<Value> {
        let mut eval = Args::with_capacity(8, script.source().len() + 256);
        eval.arg("EVAL").arg(script.source());
        for arg in evalsha.each().skip(2) {
            eval.arg(arg);
        }
        self.store.query(&eval).await
    }
}

/// The reply of a call of `op` that had a time limit.
fn timed<T>(op: &'static str, reply: Result<RedisResult<T>, Elapsed>) -> Result<T, LockError> {
    match reply {
        Ok(reply) => Ok(reply?),
        Err(Elapsed(after)) => Err(LockError::RedisTimeout { op, after }),
    }
}

/// Whether the server answered a plain command with an error reply: it refused the
/// command, which did not run (a lost connection or a timeout proves nothing). A code
/// redis-rs does not know (`WRONGTYPE`, say) is of kind `Extension`.
pub(crate) fn refused(reply: &Result<Value, LockError>) -> bool {
    use redis::ErrorKind::{Extension, Server};
    matches!(reply, Err(LockError::Redis(e)) if matches!(e.kind(), Server(_) | Extension))
}

/// `value` as `T`, or the reply `op` did not expect.
pub(crate) fn decode<T: FromRedisValue>(op: &'static str, value: Value) -> Result<T, LockError> {
    T::from_redis_value(value).map_err(|e| LockError::UnexpectedReply(format!("{op}: {e}")))
}
