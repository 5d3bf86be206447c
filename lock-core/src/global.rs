//! The process-wide client used by `#[cache_lock]` when no `client = ...` is given.

use std::sync::OnceLock;

use crate::{LockClient, LockError};

static GLOBAL: OnceLock<LockClient> = OnceLock::new();

/// Installs the process-wide [`LockClient`] (once, at start-up). Returns the client back
/// if one was installed already.
///
/// ```no_run
/// # async fn start() -> Result<(), lock_core::LockError> {
/// let client = lock_core::LockClient::open("redis://127.0.0.1:6379/").await?;
/// lock_core::install_global(client).expect("installed once");
/// # Ok(()) }
/// ```
pub fn install_global(client: LockClient) -> Result<(), LockClient> {
    GLOBAL.set(client)
}

/// The process-wide client, if [`install_global`] was called.
pub fn global() -> Result<&'static LockClient, LockError> {
    GLOBAL.get().ok_or_else(|| {
        LockError::InvalidConfig(
            "no process-wide LockClient is installed: call lock_core::install_global(client) \
             at start-up, or give #[cache_lock] a `client = ...` argument"
                .into(),
        )
    })
}
