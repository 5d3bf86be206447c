//! One Redis node's connection: a reconnecting `ConnectionManager`, made again when
//! the runtime it was made on ends.
//!
//! redis-rs runs a manager's connection task and its reconnects on the runtime of the
//! call that starts them, and a reconnect in progress holds that runtime's timers.
//! Polled after that runtime ended, the reconnect panics (tokio refuses a timer of an
//! ended runtime), and the manager's shared reconnect stays poisoned: every later call
//! would panic too. A client outlives runtimes (a guard dropped as a `#[tokio::test]`
//! ends is released on the background runtime; a global client serves many tests), so:
//! - the node watches the runtime its manager was made on, and when it ends, the next
//!   call makes a new manager (connecting lazily, on the caller's runtime);
//! - a call whose manager panics anyway (a reconnect started on another runtime that
//!   has since ended) fails with a connection error, and the manager is made again.
//!
//! A manager handed in by the user cannot be made again: its calls fail instead.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use futures_util::FutureExt;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, Pipeline, RedisResult, ScriptInvocation};
use tokio::runtime::Handle;
use tokio::sync::oneshot;

use super::deployment::own_reply;
use super::{Replies, Reply, Store};

/// One node's connection manager, made again when its runtime ends.
pub(crate) struct Node {
    home: ArcSwap<Home>,
    /// What makes a new manager; `None` for a manager handed in by the user.
    remake: Option<(redis::Client, ConnectionManagerConfig)>,
}

/// A manager and the watch on the runtime it was made on.
struct Home {
    manager: ConnectionManager,
    /// Set when that runtime has ended, or when a call on the manager panicked.
    ended: Arc<AtomicBool>,
    /// Dropped with this home, it ends the watching task.
    _watch: Option<oneshot::Sender<()>>,
}

impl Home {
    /// `manager`, watched on the current runtime (if any).
    fn watched(manager: ConnectionManager) -> Self {
        let ended = Arc::new(AtomicBool::new(false));
        let watch = Handle::try_current().ok().map(|rt| {
            let (stop, stopped) = oneshot::channel::<()>();
            let flag = SetOnDrop(ended.clone());
            // A runtime that ends drops its tasks, and with this one the flag.
            drop(rt.spawn(async move {
                let _flag = flag;
                let _ = stopped.await;
            }));
            stop
        });
        Self {
            manager,
            ended,
            _watch: watch,
        }
    }
}

struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Node {
    /// A node on `manager`, made on the current runtime; `remake`, when known, makes
    /// its successors.
    pub(crate) fn new(
        manager: ConnectionManager,
        remake: Option<(redis::Client, ConnectionManagerConfig)>,
    ) -> Self {
        Self {
            home: ArcSwap::from_pointee(Home::watched(manager)),
            remake,
        }
    }

    /// The manager to call: the one in place, or a new one if its runtime ended.
    fn manager(&self) -> ConnectionManager {
        let home = self.home.load();
        if !home.ended.load(Ordering::Acquire) {
            return home.manager.clone();
        }
        let Some((client, config)) = &self.remake else {
            return home.manager.clone();
        };
        let Ok(manager) = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
        else {
            return home.manager.clone();
        };
        let fresh = Arc::new(Home::watched(manager.clone()));
        // Another call may have made one first: every call uses the one in place.
        let before = self.home.compare_and_swap(&*home, fresh);
        if Arc::ptr_eq(&before, &*home) {
            tracing::debug!("lock-core: the connection's runtime ended; connecting again");
            manager
        } else {
            before.manager.clone()
        }
    }

    /// Runs `call` on the manager; a panic inside it is the error of this call, and
    /// the manager is made again for the next.
    pub(crate) async fn call<'a, T, Fut>(
        &'a self,
        call: impl FnOnce(ConnectionManager) -> Fut,
    ) -> RedisResult<T>
    where
        Fut: Future<Output = RedisResult<T>> + Send + 'a,
    {
        match AssertUnwindSafe(call(self.manager())).catch_unwind().await {
            Ok(reply) => reply,
            Err(_) => {
                self.home.load().ended.store(true, Ordering::Release);
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the connection's reconnect failed inside redis-rs (its runtime ended); \
                     the next call connects again",
                )
                .into())
            }
        }
    }
}

impl Store for Node {
    fn query<'a>(&'a self, cmd: &'a Cmd) -> Reply<'a> {
        Box::pin(self.call(move |mut c| async move { cmd.query_async(&mut c).await }))
    }

    fn pipeline<'a>(&'a self, pipe: &'a Pipeline) -> Replies<'a> {
        Box::pin(self.call(move |mut c| async move {
            let replies = c.req_packed_commands(pipe, 0, pipe.len()).await?;
            Ok(replies.into_iter().map(own_reply).collect())
        }))
    }

    fn invoke<'a>(&'a self, invocation: &'a ScriptInvocation<'a>) -> Reply<'a> {
        Box::pin(self.call(move |mut c| async move { invocation.invoke_async(&mut c).await }))
    }

    fn group(&self, _key: &str) -> u16 {
        0
    }
}
