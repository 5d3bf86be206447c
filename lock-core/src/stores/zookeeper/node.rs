//! One contender node through lost connections, as Curator handles it: a request
//! whose connection was lost (or given up on) may or may not have been executed, so a
//! create is followed by a look for our node by its per-attempt uuid, and a delete is
//! sent again, until done or the session is over.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::{terminal, uuid, zk_error};
use crate::client::cleanup::{self, OnDrop};

/// First pause before a request is sent again; doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);

/// Whether the outcome of a request that failed with `e` is unknown: its connection
/// was lost or given up on after it was sent, so the server may have executed it.
fn unsettled(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Custom(_)
            | zk::Error::Timeout
            | zk::Error::UnexpectedError(_)
            | zk::Error::UnmarshalError { .. }
    )
}

/// When to send a request again after an unknown outcome.
pub(super) struct Retry<'a> {
    client: &'a zk::Client,
    pause: Duration,
    /// Set at the first unknown outcome: the server ends a session it has not heard
    /// from for its timeout, so twice that later the node is gone with it (this also
    /// ends the retries of a client whose runtime is gone and that answers nothing).
    give_up: Option<Instant>,
}

impl<'a> Retry<'a> {
    pub(super) fn new(client: &'a zk::Client) -> Self {
        Self {
            client,
            pause: RETRY_FIRST,
            give_up: None,
        }
    }

    /// After a failure with `e`: waits a little and answers true if the request
    /// should be sent again (the client holds it until it has reconnected).
    pub(super) async fn again(&mut self, e: &zk::Error) -> bool {
        if !unsettled(e) || terminal(self.client.state()) {
            return false;
        }
        let now = Instant::now();
        let give_up = *self
            .give_up
            .get_or_insert_with(|| now + self.client.session_timeout() * 2);
        if now + self.pause >= give_up {
            return false;
        }
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(RETRY_MAX);
        true
    }
}

/// Runs the request `op` makes, again after unknown outcomes (for requests that are
/// safe to repeat).
async fn retried<T, Fut>(client: &zk::Client, mut op: impl FnMut() -> Fut) -> Result<T, zk::Error>
where
    Fut: std::future::Future<Output = Result<T, zk::Error>>,
{
    let mut retry = Retry::new(client);
    loop {
        match op().await {
            Err(e) if retry.again(&e).await => {}
            done => return done,
        }
    }
}

/// Lists `dir`, again after unknown outcomes.
pub(super) async fn list(client: &zk::Client, dir: &str) -> Result<Vec<String>, zk::Error> {
    retried(client, || client.list_children(dir)).await
}

/// Deletes `path`, again after unknown outcomes, until done, gone, or the session is
/// over. `Ok(true)` if we deleted it: a node gone after an unknown outcome counts, as
/// that attempt deleted it; `Ok(false)` if it was gone already.
pub(super) async fn delete(client: &zk::Client, path: &str) -> Result<bool, zk::Error> {
    let mut retry = Retry::new(client);
    let mut unknown = false;
    loop {
        match client.delete(path, None).await {
            Ok(()) => return Ok(true),
            Err(zk::Error::NoNode) => return Ok(unknown),
            Err(e) if retry.again(&e).await => unknown = true,
            Err(e) => return Err(e),
        }
    }
}

/// One acquisition's node: `<dir>/_c_<uuid><kind><sequence>` (`kind`: `-lock-`, or
/// `-__READ__` / `-__WRIT__` for a read-write lock), the uuid fresh for the attempt, so
/// that the node can be found by it when the create's reply is lost.
#[derive(Clone)]
pub(super) struct Contender {
    client: zk::Client,
    dir: String,
    /// `_c_<uuid><kind>`: the start of our node's name.
    ours: String,
    lock: String,
}

impl Contender {
    pub(super) fn new(client: zk::Client, dir: String, lock: String, kind: &str) -> Self {
        let ours = format!("_c_{}{kind}", uuid());
        Self {
            client,
            dir,
            ours,
            lock,
        }
    }

    /// Creates our node (and the lock's node, on the first use of a name), finding it
    /// by its uuid after an unknown outcome: its path and stat.
    pub(super) async fn create(&self) -> Result<(String, zk::Stat), zk::Error> {
        let client = &self.client;
        let prefix = format!("{}/{}", self.dir, self.ours);
        let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let mut retry = Retry::new(client);
        let mut made_dir = false;
        loop {
            match client
                .create(&prefix, self.lock.as_bytes(), &ephemeral)
                .await
            {
                Ok((stat, seq)) => return Ok((format!("{prefix}{seq}"), stat)),
                // Made only when missing, not with a round trip on every acquisition.
                Err(zk::Error::NoNode) if !made_dir => {
                    made_dir = true;
                    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
                    retried(client, || client.mkdir(&self.dir, &persistent)).await?;
                }
                Err(e) if retry.again(&e).await => {
                    // Not found, or gone again (deleted by hand): contend anew.
                    if let Some(path) = self.find().await?
                        && let Some(stat) = self.stat(&path).await?
                    {
                        return Ok((path, stat));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Our node's path, if it exists.
    async fn find(&self) -> Result<Option<String>, zk::Error> {
        match list(&self.client, &self.dir).await {
            Ok(children) => Ok(children
                .into_iter()
                .find(|c| c.starts_with(&self.ours))
                .map(|c| format!("{}/{c}", self.dir))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn stat(&self, path: &str) -> Result<Option<zk::Stat>, zk::Error> {
        retried(&self.client, || self.client.check_stat(path)).await
    }

    /// Until disarmed, dropping the guard deletes our node in the background: `node`
    /// if known, else whatever node of ours a create in flight made.
    pub(super) fn leave_on_drop(&self, node: Option<String>) -> OnDrop<impl FnOnce() + use<>> {
        let this = self.clone();
        OnDrop::new(move || {
            let lock = this.lock.clone();
            cleanup::spawn("removing a ZooKeeper contender node", lock, async move {
                // Sent after the create, so the server has executed that create first.
                let node = match node {
                    Some(node) => Some(node),
                    None => this.find().await.map_err(zk_error)?,
                };
                if let Some(node) = node {
                    delete(&this.client, &node).await.map_err(zk_error)?;
                }
                Ok(())
            });
        })
    }
}
