//! The process-wide lock store used by `#[cache_lock]` when no `client = ...` is given:
//! any store ([`AnyLocks`]).

use std::sync::OnceLock;

use crate::error::LockError;
use crate::stores::AnyLocks;

static GLOBAL: OnceLock<AnyLocks> = OnceLock::new();

/// Installs the process-wide lock store (once, at start-up): a
/// [`LockClient`](crate::LockClient), a [`Redlock`](crate::Redlock), a
/// [`MemoryLocks`](crate::MemoryLocks), a database or ZooKeeper store, or an
/// [`AnyLocks`] opened from a URL. Returns it back if one was installed already.
///
/// ```no_run
/// # async fn start() -> Result<(), lock_core::LockError> {
/// let client = lock_core::LockClient::open("redis://127.0.0.1:6379/").await?;
/// lock_core::install_global(client).expect("installed once");
/// # Ok(()) }
/// ```
pub fn install_global(locks: impl Into<AnyLocks>) -> Result<(), AnyLocks> {
    GLOBAL.set(locks.into())
}

/// The process-wide lock store, if [`install_global`] was called.
pub fn global() -> Result<&'static AnyLocks, LockError> {
    GLOBAL.get().ok_or_else(|| {
        LockError::InvalidConfig(
            "no process-wide lock store is installed: call lock_core::install_global(locks) \
             at start-up, or give #[cache_lock] a `client = ...` argument"
                .into(),
        )
    })
}
