//! The members a store talks to, and the one way it calls them: on the member that
//! answered last, moving on to the next when one fails to answer within its share
//! of the call's time limit (stopped, cut off, without a leader) — as etcd's Go client
//! pins one endpoint and switches on failure. A member that hangs costs a call part
//! of its time limit, never all of it, so a lease is renewed through another member
//! before it runs out.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client as etcd;
use tokio::time::Instant;

use super::{STORE, etcd_error};
use crate::error::LockError;

/// The least time one member gets to answer.
const MIN_TRY: Duration = Duration::from_millis(100);
/// The pause after every member failed in turn, before the next round.
const ROUND_PAUSE: Duration = Duration::from_millis(20);

pub(super) struct Members {
    /// One client per member (or the user's own client, alone).
    clients: Vec<etcd::Client>,
    /// The member calls go to first (modulo the number of members).
    current: AtomicUsize,
    /// A call's time limit, over all the members it tries.
    within: Duration,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members")
            .field("members", &self.clients.len())
            .field("within", &self.within)
            .finish_non_exhaustive()
    }
}

/// Whether a call that failed with `e` may succeed on another member: the member
/// could not be reached, or has no leader (etcd answers `Unavailable` for both).
fn elsewhere(e: &etcd::Error) -> bool {
    match e {
        // gRPC's `Unavailable`.
        etcd::Error::GRpcStatus(s) => i32::from(s.code()) == 14,
        etcd::Error::TransportError(_) | etcd::Error::IoError(_) => true,
        _ => false,
    }
}

impl Members {
    pub(super) fn new(clients: Vec<etcd::Client>, within: Duration) -> Self {
        debug_assert!(!clients.is_empty());
        Self {
            clients,
            current: AtomicUsize::new(0),
            within,
        }
    }

    /// Runs `op` on a member (see the module docs); `what` names it in errors. Only
    /// for requests that may be sent twice: the first may have been executed by a
    /// member that then did not answer.
    pub(super) async fn call<T, F, Fut>(&self, what: &str, mut op: F) -> Result<T, LockError>
    where
        F: FnMut(etcd::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd::Error>>,
    {
        let deadline = Instant::now() + self.within;
        let n = self.clients.len();
        let share = (self.within / u32::try_from(n).unwrap_or(u32::MAX)).max(MIN_TRY);
        let mut failed = 0;
        let mut last: Option<LockError> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(last.unwrap_or_else(|| LockError::Store {
                    store: STORE,
                    message: format!("{what}: no member answered within {:?}", self.within),
                }));
            }
            let at = self.current.load(Ordering::Relaxed);
            let client = self.clients[at % n].clone();
            match tokio::time::timeout(share.min(left), op(client)).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if elsewhere(&e) => last = Some(etcd_error(e)),
                Ok(Err(e)) => return Err(etcd_error(e)),
                Err(_) => {
                    last = Some(LockError::Store {
                        store: STORE,
                        message: format!("{what}: a member did not answer within {share:?}"),
                    })
                }
            }
            // Others may have moved on already: move once from where this call was.
            let _ = self.current.compare_exchange(
                at,
                at.wrapping_add(1),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
            failed += 1;
            if failed % n == 0 {
                tokio::time::sleep(ROUND_PAUSE.min(left)).await;
            }
        }
    }
}
