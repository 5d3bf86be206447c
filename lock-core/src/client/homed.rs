//! A store's connection made again when the runtime it was made on ends: a redis-rs
//! connection, an etcd client.
//!
//! A client library runs a connection's tasks on the runtime it was made on (etcd's
//! gRPC channel, redis-rs's connection): once that runtime ends, every call fails.
//! redis-rs runs a connection's task on the runtime it was made on (a Cluster
//! connection's for good: once that runtime ends, every call fails), and a
//! `ConnectionManager`'s reconnects on the runtime of the call that starts them, where
//! a reconnect in progress holds that runtime's timers. Polled after that runtime
//! ended, the reconnect panics (tokio refuses a timer of an ended runtime), and the
//! manager's shared reconnect stays poisoned: every later call would panic too. A
//! client outlives runtimes (a guard dropped as a `#[tokio::test]` ends is released on
//! the background runtime; a global client serves many tests), so:
//! - [`Homed`] watches the runtime its connection was made on, and when it ends, the
//!   next call makes a new connection, on the caller's runtime;
//! - a call that panics anyway (a reconnect started on another runtime that has since
//!   ended) fails with a connection error, and the connection is made again.
//!
//! A connection handed in by the user cannot be made again: its calls fail instead.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use redis::RedisError;
use tokio::runtime::Handle;
use tokio::sync::{Mutex, oneshot};

/// Makes a new connection like the first.
pub(crate) type Make<C, E = RedisError> =
    Box<dyn Fn() -> BoxFuture<'static, Result<C, E>> + Send + Sync>;

/// A connection, made again when its runtime ends; `E` is its client's error.
pub(crate) struct Homed<C, E = RedisError> {
    /// Read on every call, written only to replace an ended connection.
    home: RwLock<Home<C>>,
    /// `None` for a connection handed in by the user.
    make: Option<Make<C, E>>,
    /// Held while a new connection is made, so the calls that find the old one ended
    /// make one, not one each.
    making: Mutex<()>,
}

/// A connection and the watch on the runtime it was made on.
struct Home<C> {
    conn: C,
    /// Set when that runtime has ended, or when a call on the connection panicked.
    ended: Arc<AtomicBool>,
    /// Dropped with this home, it ends the watching task.
    _watch: Option<oneshot::Sender<()>>,
}

impl<C> Home<C> {
    /// `conn`, watched on the current runtime (if any).
    fn watched(conn: C) -> Self {
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
            conn,
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

impl<C: Clone + Send + Sync + 'static, E: From<std::io::Error>> Homed<C, E> {
    /// `conn`, made on the current runtime; `make`, when known, makes its successors.
    pub(crate) fn new(conn: C, make: Option<Make<C, E>>) -> Self {
        Self {
            home: RwLock::new(Home::watched(conn)),
            make,
            making: Mutex::new(()),
        }
    }

    /// The connection in place, or, when its runtime ended and a new one can be made,
    /// what makes it.
    fn in_place(&self) -> Result<C, &Make<C, E>> {
        let home = self.home.read().unwrap_or_else(PoisonError::into_inner);
        match &self.make {
            Some(make) if home.ended.load(Ordering::Acquire) => Err(make),
            _ => Ok(home.conn.clone()),
        }
    }

    /// Makes a new connection in place of the ended one with `make` (once for all the
    /// calls that found it ended).
    async fn remake(&self) -> Result<C, E> {
        let _making = self.making.lock().await;
        let make = match self.in_place() {
            // Another call made it while this one waited.
            Ok(conn) => return Ok(conn),
            Err(make) => make,
        };
        let conn = make().await?;
        *self.home.write().unwrap_or_else(PoisonError::into_inner) = Home::watched(conn.clone());
        tracing::debug!("lock-core: the connection's runtime ended; connected again");
        Ok(conn)
    }

    fn set_ended(&self) {
        let home = self.home.read().unwrap_or_else(PoisonError::into_inner);
        home.ended.store(true, Ordering::Release);
    }

    /// Runs `call` on the connection; a panic inside it is the error of this call, and
    /// the connection is made again for the next.
    pub(crate) async fn call<T, Fut>(&self, call: impl FnOnce(C) -> Fut) -> Result<T, E>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let conn = match self.in_place() {
            Ok(conn) => conn,
            Err(_) => Box::pin(self.remake()).await?,
        };
        match AssertUnwindSafe(call(conn)).catch_unwind().await {
            Ok(reply) => reply,
            Err(_) => {
                self.set_ended();
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the connection failed inside its client library (a reconnect on a runtime \
                     that has ended); a connection lock-core opened is made again for the next \
                     call",
                )
                .into())
            }
        }
    }
}
