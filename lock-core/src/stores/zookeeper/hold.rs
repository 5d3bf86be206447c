//! One held contender node and the task watching its session and node.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{terminal, zk_error};
use crate::metrics::{self, StoreKind};
use crate::stores::session::{BoxFuture, Hold};
use crate::{FencingToken, LockError};

/// Where a held lock stands.
#[derive(Clone, Copy, Debug)]
enum Standing {
    Connected,
    /// Disconnected: held until then unless the connection comes back.
    Suspended(Instant),
    Lost,
}

/// One held contender node and the task watching its session and node.
pub(super) struct ZkHold {
    client: zk::Client,
    name: String,
    path: String,
    token: u64,
    grace: Duration,
    standing: watch::Receiver<Standing>,
    monitor: tokio::task::JoinHandle<()>,
}

impl ZkHold {
    pub(super) fn start(client: zk::Client, name: String, path: String, token: u64) -> Self {
        let grace = client.session_timeout() / 3;
        let (tx, standing) = watch::channel(Standing::Connected);
        let (watching, node, lock) = (client.clone(), path.clone(), name.clone());
        let monitor = tokio::spawn(async move {
            let mut states = watching.state_watcher();
            let lost = |why: &str| {
                tracing::warn!(lock = %lock, "lock lost: {why}");
                tx.send_replace(Standing::Lost);
                metrics::lost(StoreKind::Zookeeper);
            };
            // The node's own watch: fires on its deletion (or any change).
            let mut node_watch = match watching.check_and_watch_stat(&node).await {
                Ok((Some(_), w)) => Some(w),
                Ok((None, _)) => return lost("its node is gone"),
                Err(_) => None,
            };
            loop {
                let suspended_until = match *tx.borrow() {
                    Standing::Suspended(t) => Some(t),
                    _ => None,
                };
                let node_changed = async {
                    match node_watch.take() {
                        Some(w) => w.changed().await,
                        None => std::future::pending().await,
                    }
                };
                let deadline = async {
                    match suspended_until {
                        Some(t) => tokio::time::sleep_until(t).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    state = states.changed() => match state {
                        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => {
                            tx.send_replace(Standing::Connected);
                        }
                        zk::SessionState::Disconnected => {
                            tx.send_replace(Standing::Suspended(Instant::now() + grace));
                        }
                        s if terminal(s) => return lost("its ZooKeeper session ended"),
                        _ => {}
                    },
                    event = node_changed => {
                        if event.event_type == zk::EventType::NodeDeleted {
                            return lost("its node was deleted");
                        }
                        // Another change: watch again.
                        match watching.check_and_watch_stat(&node).await {
                            Ok((Some(_), w)) => node_watch = Some(w),
                            Ok((None, _)) => return lost("its node is gone"),
                            Err(_) => {}
                        }
                    }
                    () = deadline => return lost("its ZooKeeper connection stayed down"),
                }
            }
        });
        Self {
            client,
            name,
            path,
            token,
            grace,
            standing,
            monitor,
        }
    }
}

impl Drop for ZkHold {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

impl Hold for ZkHold {
    fn valid_for(&self) -> Duration {
        match *self.standing.borrow() {
            Standing::Connected => self.grace,
            Standing::Suspended(t) => t.saturating_duration_since(Instant::now()),
            Standing::Lost => Duration::ZERO,
        }
    }

    fn token(&self) -> Option<FencingToken> {
        Some(FencingToken::new(self.token, self.token))
    }

    fn lost(&self) -> BoxFuture<()> {
        let mut standing = self.standing.clone();
        Box::pin(async move {
            let _ = standing.wait_for(|s| matches!(s, Standing::Lost)).await;
        })
    }

    fn release(self: Box<Self>) -> BoxFuture<Result<(), LockError>> {
        self.monitor.abort();
        let lost = matches!(*self.standing.borrow(), Standing::Lost);
        let (client, path, name) = (self.client.clone(), self.path.clone(), self.name.clone());
        Box::pin(async move {
            match client.delete(&path, None).await {
                Ok(()) if !lost => Ok(()),
                Ok(()) | Err(zk::Error::NoNode) => Err(LockError::Expired { key: name }),
                Err(e) if lost => {
                    tracing::debug!(lock = %name, error = %e, "deleting a lost lock's node failed");
                    Err(LockError::Expired { key: name })
                }
                Err(e) => Err(zk_error(e)),
            }
        })
    }

    fn release_in_background(self: Box<Self>) {
        let name = self.name.clone();
        crate::cleanup::spawn("releasing a ZooKeeper lock", name, async move {
            self.release().await
        });
    }
}
