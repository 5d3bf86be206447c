//! The one owner of background work: "clean up on drop, in the background".
//!
//! A guard that is dropped, an acquisition whose future is cancelled mid-request, a
//! release that is cancelled while its reply is in flight: each leaves work for the
//! store that must still happen, and often a name in the client's registry that waits
//! for it. [`OnDrop`] runs a closure unless disarmed, and [`spawn`] runs the cleanup on
//! a runtime that is alive, so no state waits forever on a task that never runs:
//! - the caller's runtime when there is one (cheap, and tokio's paused clock in tests
//!   stays the clock of the work);
//! - otherwise, or when that runtime shuts down before the task started (a guard
//!   dropped as a `#[tokio::test]` ends, a runtime that ended while a client lived on
//!   in another), the process's own background runtime ([`background`]): one thread
//!   with a current-thread runtime, started on first need, that lives as long as the
//!   process.
//!
//! A task that had started when its runtime shut down is dropped mid-way; the work it
//! was doing is guarded by its own [`OnDrop`]s, which spawn their cleanup again here
//! (and so on the background runtime).

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::runtime::Handle;

use crate::error::LockError;

/// Runs `f` when dropped, unless [`disarm`](Self::disarm)ed first.
pub(crate) struct OnDrop<F: FnOnce()>(Option<F>);

impl<F: FnOnce()> OnDrop<F> {
    pub(crate) fn new(f: F) -> Self {
        Self(Some(f))
    }

    /// The work is done: do not run the closure.
    pub(crate) fn disarm(mut self) {
        self.0 = None;
    }
}

impl<F: FnOnce()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Runs the call `call` makes, and again after a Redis failure (at most twice more,
/// within about a second): background work has nobody to report a failure to, and a
/// connection's first call after it broke (its runtime ended, the server restarted, a
/// reset) fails while it reconnects. Only for calls that are safe to repeat (owner-
/// checked deletes). Returns the last answer, and whether an earlier try failed (its
/// outcome unknown: it may have done the work).
///
/// Any Redis failure is tried again, error replies too, where a caller who is there to
/// be told gets an error reply at once (`LockError::is_no_answer` decides there): a
/// restarted server answers `LOADING`, and a resharding cluster `TRYAGAIN`, until the
/// call can go through.
pub(crate) async fn patiently<T, Fut>(
    what: &'static str,
    mut call: impl FnMut() -> Fut,
) -> (Result<T, LockError>, bool)
where
    Fut: Future<Output = Result<T, LockError>>,
{
    let mut failed = 0u32;
    loop {
        match call().await {
            Err(e) if e.is_redis() && failed < 2 => {
                failed += 1;
                tracing::debug!(error = %e, "{what} failed; trying again");
                tokio::time::sleep(Duration::from_millis(100) * 4u32.pow(failed - 1)).await;
            }
            answer => return (answer, failed > 0),
        }
    }
}

/// The process's background runtime: one thread, a current-thread runtime with IO and
/// time, started on first use. `None` only if the OS refused the thread or the runtime
/// (then the work is dropped and logged: the lease frees what it held).
pub(crate) fn background() -> Option<&'static Handle> {
    static BACKGROUND: OnceLock<Option<Handle>> = OnceLock::new();
    BACKGROUND
        .get_or_init(|| {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "lock-core: cannot build the background runtime");
                    return None;
                }
            };
            let handle = runtime.handle().clone();
            let started = std::thread::Builder::new()
                .name("lock-core-background".into())
                .spawn(move || runtime.block_on(std::future::pending::<()>()));
            match started {
                Ok(_) => Some(handle),
                Err(e) => {
                    tracing::error!(error = %e, "lock-core: cannot start the background thread");
                    None
                }
            }
        })
        .as_ref()
}

/// Runs `cleanup` in the background on a live runtime (see the module docs); a failure
/// is logged with `what` and `lock`. Never blocks, never panics, needs no runtime.
pub(crate) fn spawn<Fut>(what: &'static str, lock: String, cleanup: Fut)
where
    Fut: Future<Output = Result<(), LockError>> + Send + 'static,
{
    spawn_task(async move {
        if let Err(e) = cleanup.await {
            tracing::debug!(lock = %lock, error = %e, "{what} failed; the lease frees the lock");
        }
    });
}

/// Runs `task` on a live runtime: the caller's, or the background runtime when there is
/// none or the caller's shuts down before the task started.
pub(crate) fn spawn_task<Fut>(task: Fut)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    let task = Box::pin(task);
    match Handle::try_current() {
        // A runtime that is shutting down drops the task unpolled: it moves on then.
        Ok(rt) => drop(rt.spawn(Rescued::new(task, false))),
        Err(_) => to_background(task),
    }
}

/// Runs `task` on the process's background runtime, for work that must outlive the
/// runtime of the call that started it (a ZooKeeper session, watching a grant for as
/// long as it is held, reserving a block of ids); on the caller's runtime only if the
/// background one could not start.
pub(crate) fn spawn_lasting<T, Fut>(task: Fut) -> tokio::task::JoinHandle<T>
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    match lasting_runtime() {
        Some(rt) => rt.spawn(task),
        // Neither: tokio's own panic, as any spawn outside a runtime.
        None => tokio::spawn(task),
    }
}

/// Where lasting work runs ([`spawn_lasting`]), for a caller that must not panic on a
/// thread with no runtime: the background runtime, else the caller's; `None` with
/// neither.
pub(crate) fn lasting_runtime() -> Option<Handle> {
    background().cloned().or_else(|| Handle::try_current().ok())
}

/// Runs `f` (a drop that spawns, say sqlx's) inside a runtime's context: the caller's,
/// else the background runtime's. On a thread with neither, `f` comes back unrun.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) fn in_runtime<F: FnOnce()>(f: F) -> Result<(), F> {
    if Handle::try_current().is_ok() {
        f();
        return Ok(());
    }
    match background() {
        Some(rt) => {
            let _entered = rt.enter();
            f();
            Ok(())
        }
        None => Err(f),
    }
}

/// Runs `task` on the background runtime ([`spawn_lasting`]) and answers its output: a
/// store's connect, whose connection must outlive the caller's runtime. A task cut off
/// before it finished (its runtime shut down) is an error of `store`.
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
pub(crate) async fn lasting<T, Fut>(store: &'static str, task: Fut) -> Result<T, LockError>
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    spawn_lasting(task).await.map_err(|e| LockError::Store {
        store,
        message: format!("connecting was cut off: {e}"),
    })
}

fn to_background<Fut>(task: Pin<Box<Fut>>)
where
    Fut: Future<Output = ()> + Send + 'static,
{
    match background() {
        Some(rt) => drop(rt.spawn(Rescued::new(task, true))),
        None => {
            tracing::warn!("lock-core: no runtime for background work; leases free what it held")
        }
    }
}

/// A task that moves to the background runtime if dropped before it ran.
struct Rescued<Fut: Future<Output = ()> + Send + 'static> {
    task: Option<Pin<Box<Fut>>>,
    /// Dropped now, the task goes to the background runtime: until its first poll, and
    /// never once there (dropped unpolled there only as the process ends).
    rescue: bool,
}

impl<Fut: Future<Output = ()> + Send + 'static> Rescued<Fut> {
    fn new(task: Pin<Box<Fut>>, on_background: bool) -> Self {
        Self {
            task: Some(task),
            rescue: !on_background,
        }
    }
}

impl<Fut: Future<Output = ()> + Send + 'static> Future for Rescued<Fut> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.rescue = false;
        let Some(task) = self.task.as_mut() else {
            return Poll::Ready(());
        };
        let Poll::Ready(()) = task.as_mut().poll(cx) else {
            return Poll::Pending;
        };
        self.task = None;
        Poll::Ready(())
    }
}

impl<Fut: Future<Output = ()> + Send + 'static> Drop for Rescued<Fut> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take().filter(|_| self.rescue) {
            to_background(task);
        }
    }
}
