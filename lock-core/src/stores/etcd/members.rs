//! The members a store talks to, and the one way it calls them: on the member that
//! answered last, moving on to the next when one fails to answer within its share
//! of the call's time limit (stopped, cut off, without a leader) — as etcd's Go client
//! pins one endpoint and switches on failure. A member that hangs costs a call part
//! of its time limit, never all of it, so a lease is renewed through another member
//! before it runs out.
//!
//! A member's connection is made on the runtime of the call that needs it, so a call
//! does not hop to another thread and back; once that runtime has ended (and the
//! connection's tasks with it), the next call connects again on its own runtime
//! ([`Homed`]).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client as etcd;
use tokio::time::Instant;

use super::{STORE, etcd_error, timed};
use crate::client::homed::{Homed, Make};
use crate::error::LockError;

/// The least time one member gets to answer.
const MIN_TRY: Duration = Duration::from_millis(100);
/// The pause after every member failed in turn, before the next round.
const ROUND_PAUSE: Duration = Duration::from_millis(20);

pub(super) struct Members {
    /// One connection per member (or the user's own client, alone).
    members: Vec<Homed<etcd::Client, etcd::Error>>,
    /// The member calls go to first (modulo the number of members).
    current: AtomicUsize,
    /// A call's time limit, over all the members it tries.
    within: Duration,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members")
            .field("members", &self.members.len())
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
    /// Connects to every one of `endpoints`, each within `within` (every call's limit
    /// too, a connection made again included).
    pub(super) async fn connect(
        endpoints: Vec<String>,
        options: etcd::ConnectOptions,
        within: Duration,
    ) -> Result<Self, LockError> {
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let connecting = etcd::Client::connect([endpoint.as_str()], Some(options.clone()));
            let client = timed("connecting to etcd", within, connecting)
                .await?
                .map_err(etcd_error)?;
            let options = options.clone();
            let remake: Make<etcd::Client, etcd::Error> = Box::new(move || {
                let (endpoint, options) = (endpoint.clone(), options.clone());
                Box::pin(async move { etcd::Client::connect([endpoint], Some(options)).await })
            });
            members.push(Homed::new(client, Some(remake)));
        }
        Ok(Self::of(members, within))
    }

    /// The user's own client, alone, used as it is.
    pub(super) fn handed_in(client: etcd::Client, within: Duration) -> Self {
        Self::of(vec![Homed::new(client, None)], within)
    }

    fn of(members: Vec<Homed<etcd::Client, etcd::Error>>, within: Duration) -> Self {
        debug_assert!(!members.is_empty());
        Self {
            members,
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
        let n = self.members.len();
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
            // A connection made again (its runtime ended) counts in the member's share.
            let attempt = self.members[at % n].call(&mut op);
            match tokio::time::timeout(share.min(left), attempt).await {
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
