//! One held contender node and the task watching its session and node.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{node, terminal, zk_error};
use crate::client::cleanup;
use crate::error::LockError;
use crate::lock::registry::Loss;
use crate::lock::seam::Held;

/// A boxed `Send` future.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where a held lock stands.
#[derive(Clone, Copy, Debug)]
enum Standing {
    Connected,
    /// Disconnected: held until then unless the connection comes back.
    Suspended(Instant),
    Lost,
}

/// One held contender node and the task watching its session and node (stopped when
/// the node is deleted or this is dropped).
pub(crate) struct ZkHold {
    client: zk::Client,
    name: String,
    path: String,
    token: u64,
    grace: Duration,
    standing: watch::Receiver<Standing>,
    monitor: tokio::task::JoinHandle<()>,
}

impl ZkHold {
    /// Starts watching a grant just made: the session's state is taken now (a grant
    /// made as the connection dropped is suspended at once), its changes from now on.
    pub(super) fn start(client: zk::Client, name: String, path: String, token: u64) -> Self {
        let grace = client.session_timeout() / 3;
        let states = client.state_watcher();
        let now = standing_in(states.peek_state(), Standing::Connected, grace);
        if matches!(now, Standing::Lost) {
            lost(&name, "its ZooKeeper session ended");
        }
        let (tx, standing) = watch::channel(now);
        // On the background runtime: the grant may be held long after the runtime
        // that took it ended.
        let monitor = cleanup::spawn_lasting(monitor(
            client.clone(),
            states,
            path.clone(),
            name.clone(),
            tx,
            grace,
        ));
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

/// Where a grant stands once the session is in `state`, having stood at `was`.
fn standing_in(state: zk::SessionState, was: Standing, grace: Duration) -> Standing {
    match (state, was) {
        (_, Standing::Lost) => Standing::Lost,
        (s, _) if terminal(s) => Standing::Lost,
        (zk::SessionState::Disconnected, Standing::Suspended(t)) => Standing::Suspended(t),
        (zk::SessionState::Disconnected, _) => Standing::Suspended(Instant::now() + grace),
        _ => Standing::Connected,
    }
}

/// Says why (the engine counts the loss once it hears of it).
fn lost(lock: &str, why: &str) {
    tracing::warn!(lock = %lock, "lock lost: {why}");
}

type StatWatch = BoxFuture<Result<(Option<zk::Stat>, zk::OneshotWatcher), zk::Error>>;

/// Asks for a watch on `node` (its deletion).
fn watch_node(client: &zk::Client, node: &str) -> StatWatch {
    let (client, node) = (client.clone(), node.to_owned());
    Box::pin(async move { client.check_and_watch_stat(&node).await })
}

/// Follows the session's states and the node's watch until the grant is lost.
async fn monitor(
    client: zk::Client,
    mut states: zk::StateWatcher,
    node: String,
    lock: String,
    tx: watch::Sender<Standing>,
    grace: Duration,
) {
    let lose = |why: &str| {
        lost(&lock, why);
        tx.send_replace(Standing::Lost);
    };
    // Asked alongside the states, so that a request held by a lost connection does
    // not keep the monitor from seeing the session's changes.
    let mut asking = Some(watch_node(&client, &node));
    // Kept across turns: the watch lives through disconnections (the client sets it
    // again on reconnecting).
    let mut node_watch: Option<BoxFuture<zk::WatchedEvent>> = None;
    loop {
        let standing = *tx.borrow();
        let suspended_until = match standing {
            Standing::Suspended(t) => Some(t),
            Standing::Lost => return,
            Standing::Connected => None,
        };
        let asked = async {
            match asking.as_mut() {
                Some(ask) => ask.await,
                None => std::future::pending().await,
            }
        };
        let node_changed = async {
            match node_watch.as_mut() {
                Some(w) => w.await,
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
            state = states.changed() => {
                let next = standing_in(state, standing, grace);
                if matches!(next, Standing::Lost) {
                    return lose("its ZooKeeper session ended");
                }
                tx.send_replace(next);
                // Back: a watch asked for on the lost connection is asked for again.
                if matches!(next, Standing::Connected) && asking.is_none() && node_watch.is_none() {
                    asking = Some(watch_node(&client, &node));
                }
            }
            answer = asked => {
                asking = None;
                match answer {
                    Ok((Some(_), w)) => node_watch = Some(Box::pin(w.changed())),
                    Ok((None, _)) => return lose("its node is gone"),
                    // Lost with its connection. If the session is back already (the
                    // state came first), no state change is left to ask again.
                    Err(zk::Error::ConnectionLoss)
                        if client.state() == zk::SessionState::SyncConnected =>
                    {
                        asking = Some(watch_node(&client, &node));
                    }
                    Err(_) => {}
                }
            }
            event = node_changed => {
                node_watch = None;
                if event.event_type == zk::EventType::NodeDeleted {
                    return lose("its node was deleted");
                }
                // Another change: watch again.
                asking = Some(watch_node(&client, &node));
            }
            () = deadline => return lose("its ZooKeeper connection stayed down"),
        }
    }
}

impl Drop for ZkHold {
    fn drop(&mut self) {
        self.monitor.abort();
    }
}

impl ZkHold {
    /// How long the grant is known to last from now: a third of the session timeout
    /// while connected, what is left of it while suspended, zero once lost.
    pub(super) fn valid_for(&self) -> Duration {
        match *self.standing.borrow() {
            Standing::Connected => self.grace,
            Standing::Suspended(t) => t.saturating_duration_since(Instant::now()),
            Standing::Lost => Duration::ZERO,
        }
    }

    /// The node's creation zxid.
    pub(super) fn token(&self) -> u64 {
        self.token
    }

    /// Resolves when the grant is lost (`None`: no longer watched, deleted or dropped).
    pub(super) fn lost(&self) -> impl Future<Output = Option<Loss>> + Send + 'static {
        let mut standing = self.standing.clone();
        async move {
            let lost = standing.wait_for(|s| matches!(s, Standing::Lost)).await;
            lost.ok().map(|_| Loss::Expired)
        }
    }

    /// Deletes the node (again after a lost connection, until the session is over):
    /// `Ok` if it was still ours.
    pub(super) async fn delete(&self) -> Result<Held, LockError> {
        self.monitor.abort();
        let lost = matches!(*self.standing.borrow(), Standing::Lost);
        match node::delete(&self.client, &self.path).await {
            Ok(true) if !lost => Ok(Ok(())),
            // Gone before we deleted it, or with its session: lost first.
            Ok(_) | Err(zk::Error::SessionExpired | zk::Error::ClientClosed) => {
                Ok(Err(Loss::Expired))
            }
            Err(e) if lost => {
                tracing::debug!(lock = %self.name, error = %e, "deleting a lost lock's node failed");
                Ok(Err(Loss::Expired))
            }
            Err(e) => Err(zk_error(e)),
        }
    }
}
