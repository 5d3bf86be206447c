//! The one helper for "clean up on drop, in the background".
//!
//! A guard that is dropped, an acquisition whose future is cancelled mid-request, a
//! release that is cancelled while its reply is in flight: each leaves work for Redis
//! that must still happen. [`OnDrop`] runs a closure unless disarmed, and [`spawn`]
//! runs the cleanup on the runtime the lock was taken on and logs a failure (the lease
//! frees the lock in the end either way).

use std::future::Future;

use tokio::runtime::Handle;

use crate::LockError;

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

/// Runs `cleanup` in the background on `runtime`; a failure is logged with `what` and
/// `lock`. Never blocks, never panics (a runtime that is shutting down drops the task).
pub(crate) fn spawn<Fut>(runtime: &Handle, what: &'static str, lock: String, cleanup: Fut)
where
    Fut: Future<Output = Result<(), LockError>> + Send + 'static,
{
    runtime.spawn(async move {
        if let Err(e) = cleanup.await {
            tracing::debug!(lock = %lock, error = %e, "{what} failed; the lease frees the lock");
        }
    });
}
