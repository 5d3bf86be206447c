//! The members a store talks to, and the one way it calls them: on the member that
//! answered last, moving on to the next when one fails to answer within its share
//! of the call's time limit (stopped, cut off, without a leader) — as etcd's Go client
//! pins one endpoint and switches on failure. A member that hangs costs a call part
//! of its time limit, never all of it, so a lease is renewed through another member
//! before it runs out.
//!
//! A member's connection is made on the runtime of the call that needs it, so a call
//! does not hop to another thread and back; once that runtime has ended (and the
//! connection's tasks with it), the next call connects again on its own runtime.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client as etcd;
use tokio::time::Instant;

use super::{STORE, etcd_error, timed};
use crate::client::cleanup::RuntimeAlive;
use crate::error::LockError;

/// The least time one member gets to answer.
const MIN_TRY: Duration = Duration::from_millis(100);
/// The pause after every member failed in turn, before the next round.
const ROUND_PAUSE: Duration = Duration::from_millis(20);

pub(super) struct Members {
    /// One per member (or the user's own client, alone).
    members: Vec<Member>,
    /// The member calls go to first (modulo the number of members).
    current: AtomicUsize,
    /// A call's time limit, over all the members it tries.
    within: Duration,
    /// How a member is connected again.
    options: etcd::ConnectOptions,
}

struct Member {
    /// `http://host:port`; `None` for a client handed in, which is never remade.
    endpoint: Option<String>,
    conn: Mutex<Conn>,
}

struct Conn {
    client: etcd::Client,
    /// The runtime the client's connection tasks run on.
    made_on: RuntimeAlive,
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

/// Connects to `endpoint` on the current runtime, within `within`.
async fn connect(
    endpoint: &str,
    options: &etcd::ConnectOptions,
    within: Duration,
) -> Result<Conn, LockError> {
    let connecting = etcd::Client::connect([endpoint], Some(options.clone()));
    let client = timed("connecting to etcd", within, connecting)
        .await?
        .map_err(etcd_error)?;
    Ok(Conn {
        client,
        made_on: RuntimeAlive::here(),
    })
}

impl Members {
    /// Connects to every one of `endpoints`, each within `within` (every call's limit
    /// too).
    pub(super) async fn connect(
        endpoints: Vec<String>,
        options: etcd::ConnectOptions,
        within: Duration,
    ) -> Result<Self, LockError> {
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let conn = connect(&endpoint, &options, within).await?;
            members.push(Member {
                endpoint: Some(endpoint),
                conn: Mutex::new(conn),
            });
        }
        Ok(Self::of(members, options, within))
    }

    /// The user's own client, alone, used as it is.
    pub(super) fn handed_in(client: etcd::Client, within: Duration) -> Self {
        let member = Member {
            endpoint: None,
            conn: Mutex::new(Conn {
                client,
                made_on: RuntimeAlive::here(),
            }),
        };
        Self::of(vec![member], etcd::ConnectOptions::new(), within)
    }

    fn of(members: Vec<Member>, options: etcd::ConnectOptions, within: Duration) -> Self {
        debug_assert!(!members.is_empty());
        Self {
            members,
            current: AtomicUsize::new(0),
            within,
            options,
        }
    }

    /// Member `i`'s client, connected again on this runtime if the runtime its
    /// connection lived on has ended.
    async fn client(&self, i: usize) -> Result<etcd::Client, LockError> {
        let member = &self.members[i];
        {
            let conn = member.conn.lock().unwrap_or_else(|p| p.into_inner());
            let Some(endpoint) = &member.endpoint else {
                return Ok(conn.client.clone());
            };
            if conn.made_on.is_alive() {
                return Ok(conn.client.clone());
            }
            tracing::debug!(endpoint = %endpoint, "etcd connection's runtime ended; connecting again");
        }
        let endpoint = member.endpoint.as_deref().unwrap_or_default();
        // Boxed: rare, and a connect future would swell every call's.
        let fresh = Box::pin(connect(endpoint, &self.options, self.within)).await?;
        let client = fresh.client.clone();
        *member.conn.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(client)
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
            let attempt = async {
                let client = self.client(at % n).await?;
                Ok::<_, LockError>(op(client).await)
            };
            match tokio::time::timeout(share.min(left), attempt).await {
                Ok(Ok(Ok(v))) => return Ok(v),
                Ok(Ok(Err(e))) if elsewhere(&e) => last = Some(etcd_error(e)),
                Ok(Ok(Err(e))) => return Err(etcd_error(e)),
                // Could not connect again: another member may be reachable.
                Ok(Err(e)) => last = Some(e),
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
