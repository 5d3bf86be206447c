//! [`ZkLocks`]: locks on ZooKeeper in the layout of Apache Curator's
//! `InterProcessMutex`, through `zookeeper-client`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod hold;
mod node;

use tokio::time::Instant;
use zookeeper_client as zk;

use self::hold::ZkHold;
use self::node::Contender;
use crate::client::cleanup;
use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockKeys, LockMode, LockName};
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::lock::registry::Loss;
use crate::lock::seam::{Backend, Capabilities, Held, Seam, Taken, Validity};
use crate::lock::{LockGuard, Request};
use crate::metrics::StoreKind;
use crate::owner::FencingToken;
use crate::stores::locks::Locks;
use crate::stores::path;

/// The guard of a [`ZkLocks`] lock: the engine's guard on ZooKeeper.
pub type ZkGuard = LockGuard<ZkBackend>;

const STORE: &str = "zookeeper";
/// Curator's lock node name: `_c_<uuid>-lock-<sequence>`.
const LOCK_NAME: &str = "-lock-";
const READ_NAME: &str = "-__READ__";
const WRITE_NAME: &str = "-__WRIT__";

/// Locks on ZooKeeper, node for node as Apache Curator's `InterProcessMutex` lays them
/// out, so a Java service using Curator and a Rust service using this crate exclude each
/// other on the same path.
///
/// - **Layout**: the lock `name` lives at `/<namespace>/<name>` (see
///   [`ZkLocks::lock_path`]; `/` and characters ZooKeeper refuses are percent-escaped).
///   Each contender creates an ephemeral sequential node `_c_<uuid>-lock-<sequence>`
///   under it; the lowest sequence holds the lock, and each waiter watches only its
///   predecessor (no herd).
/// - **Waiting** follows the wait budget; a busy `try_lock` (no wait) deletes its node
///   and answers [`LockError::Busy`] (ZooKeeper has no lease to report: `retry_after` is
///   the config's first backoff step).
/// - **Loss**, as Curator's states: the session expiring, or the lock node being
///   deleted, fires [`LockGuard::lost`] at once. A lost connection suspends the lock:
///   it is still held for a third of the session timeout after the disconnection is
///   noticed (the server may expire the session as early as that), and lost then
///   unless the connection came back (a grant made as the connection drops starts
///   suspended). [`LockGuard::valid_for`] is that third while connected, and counts
///   down while suspended.
/// - **Lost connections**, as Curator's protected mode: a request whose connection is
///   lost may still have been executed. After a create, the acquisition looks for its
///   node by the attempt's uuid and goes on with it; a delete (a release, or the
///   cleanup of a busy, timed-out, failed or cancelled acquisition, one cancelled with
///   its create in flight included) is sent again after reconnecting until it succeeds
///   or the session is over. A release waits for that (about twice the session
///   timeout at most) and answers `Unlocked` if the node was still ours.
/// - **Session**: one per `ZkLocks`, with the config's watchdog lease as its timeout;
///   an expired session is replaced on the next acquisition (when the store was opened
///   from a connect string).
/// - **Fencing tokens** are the lock node's creation zxid: grants of one lock are in
///   creation order, and zxids only grow in the ensemble.
/// - **Leases** from [`Lease::Fixed`](crate::Lease::Fixed) are not applied (the node
///   lives with the session), nor a max-hold; `hold_until_expiry` releases.
/// - **Read-write locks** ([`LockOptions::read`](crate::LockOptions::read), `write`) in
///   Curator's `InterProcessReadWriteLock` layout: `_c_<uuid>-__READ__<sequence>` and
///   `_c_<uuid>-__WRIT__<sequence>` under the lock's path, in one queue; a writer waits
///   for its predecessor, a reader for the nearest writer before it. No downgrade.
/// - The lock's parent node is persistent and stays after release (as with Curator).
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{LockConfig, ZkLocks};
///
/// let locks = ZkLocks::connect("zk1:2181,zk2:2181/app", LockConfig::new()).await?;
/// let guard = locks.lock(("report", 2026_u32)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
pub type ZkLocks = Locks<ZkBackend>;

/// The backend of [`ZkLocks`]: Curator-layout contender nodes on one session.
#[derive(Debug)]
pub struct ZkBackend {
    /// The session, replaced when it expires (if `cluster` is known).
    client: tokio::sync::Mutex<zk::Client>,
    cluster: Option<String>,
    config: LockConfig,
}

pub(super) fn zk_error(e: zk::Error) -> LockError {
    LockError::Store {
        store: STORE,
        message: e.to_string(),
    }
}

/// Connects a client whose session task runs on the process's background runtime, so
/// the session (and every node it keeps) outlives the runtime of the caller.
async fn open(cluster: &str, config: &LockConfig) -> Result<zk::Client, LockError> {
    let (cluster, timeout) = (cluster.to_owned(), config.watchdog_lease());
    let connect = async move {
        zk::Client::connector()
            .session_timeout(timeout)
            .connect(&cluster)
            .await
    };
    cleanup::lasting(STORE, connect).await?.map_err(zk_error)
}

/// Fails when the client's chroot does not exist (every lock below it would fail with
/// `NoNode`).
async fn require_chroot(client: &zk::Client) -> Result<(), LockError> {
    // The chroot the client parsed from the connect string; "/" without one.
    let chroot = client.path();
    if chroot == "/" {
        return Ok(());
    }
    // Paths are relative to the chroot: "/" is the chroot itself.
    match client.check_stat("/").await {
        Ok(Some(_)) => Ok(()),
        Ok(None) | Err(zk::Error::NoNode) => Err(LockError::InvalidConfig(format!(
            "the ZooKeeper chroot {chroot} does not exist: create it once \
             (zkCli.sh create {chroot}) or connect without a chroot"
        ))),
        Err(e) => Err(zk_error(e)),
    }
}

pub(super) fn terminal(state: zk::SessionState) -> bool {
    matches!(
        state,
        zk::SessionState::Expired | zk::SessionState::Closed | zk::SessionState::AuthFailed
    )
}

impl Locks<ZkBackend> {
    /// Connects to `cluster` (`host:port[,host:port...][/chroot]`), with the config's
    /// watchdog lease as the session timeout. A chroot must exist already (create it
    /// once, as with any ZooKeeper client); the lock paths below it are created on use.
    /// A missing chroot is an [`LockError::InvalidConfig`] here, not a `NoNode` at the
    /// first acquisition.
    pub async fn connect(cluster: &str, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let client = open(cluster, &config).await?;
        require_chroot(&client).await?;
        Ok(Self::build(client, Some(cluster.to_owned()), config))
    }

    /// Locks on an existing session (not replaced if it expires: connect again). Fails
    /// with [`LockError::InvalidConfig`] for a config that [`LockConfig::validate`]
    /// refuses.
    pub fn new(client: zk::Client, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        Ok(Self::build(client, None, config))
    }

    fn build(client: zk::Client, cluster: Option<String>, config: LockConfig) -> Self {
        let backend = ZkBackend {
            client: tokio::sync::Mutex::new(client),
            cluster,
            config,
        };
        Self::over(backend)
    }

    /// The node under which contenders for `name` queue.
    pub fn lock_path<N: LockName>(&self, name: N) -> Result<String, LockError> {
        let config = self.config();
        let name = key::escaped_name(&config.delimiter, &name)?;
        Ok(lock_path(&config.namespace, &name))
    }
}

fn lock_path(namespace: &str, name: &str) -> String {
    format!("/{}/{}", path::node(namespace), path::node(name))
}

/// The sequence part of a contender node's name (Curator sorts by it).
fn sequence(child: &str) -> &str {
    // Every contender's name ends with the server's sequence number.
    let digits = child.bytes().rev().take_while(u8::is_ascii_digit).count();
    &child[child.len() - digits..]
}

/// The kind of contender node a hold of `mode` makes, as Curator names them
/// (`InterProcessMutex`: `lock-`; `InterProcessReadWriteLock`: `__READ__`, `__WRIT__`,
/// under the same path; the two kinds of lock ignore each other's nodes).
fn node_kind(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Exclusive => LOCK_NAME,
        LockMode::Read => READ_NAME,
        LockMode::Write => WRITE_NAME,
    }
}

/// Where `ours` (at `at` in the sorted `children`) stands: `None` if it holds the lock,
/// else the contender to wait for. A writer (or a plain lock) waits for the one just
/// before it; a reader for the nearest writer before it (readers share).
fn blocker(children: &[String], at: usize, mode: LockMode) -> Option<&String> {
    match mode {
        LockMode::Read => children[..at].iter().rev().find(|c| c.contains(WRITE_NAME)),
        _ => at.checked_sub(1).map(|i| &children[i]),
    }
}

impl ZkBackend {
    /// The live session, replaced first if it expired.
    async fn client(&self) -> Result<zk::Client, LockError> {
        let mut client = self.client.lock().await;
        if terminal(client.state())
            && let Some(cluster) = &self.cluster
        {
            *client = open(cluster, &self.config).await?;
        }
        Ok(client.clone())
    }

    /// Queues for the lock `name` at `dir` and waits up to `wait` for its turn:
    /// `None` if busy then.
    async fn queue(
        &self,
        name: &str,
        (dir, mode): (String, LockMode),
        wait: Duration,
    ) -> Result<Option<ZkHold>, LockError> {
        let started = Instant::now();
        let client = self.client().await?;
        let kind = node_kind(mode);
        let contender = Contender::new(client.clone(), dir.clone(), name.to_owned(), kind);
        // The nodes of this kind of lock (a read-write lock's readers and writers).
        let same_lock = |c: &String| match mode {
            LockMode::Exclusive => c.contains(LOCK_NAME),
            _ => c.contains(READ_NAME) || c.contains(WRITE_NAME),
        };
        // Armed before the create: a cancelled or failed attempt may have made a node.
        let leave = contender.leave_on_drop(None);
        let (ours, stat) = contender.create().await.map_err(zk_error)?;
        // Until granted, leaving (cancelled, busy, timed out, failed) deletes our node.
        let leave = {
            let known = contender.leave_on_drop(Some(ours.clone()));
            leave.disarm();
            known
        };
        let our_name = &ours[dir.len() + 1..];
        let deadline = started.checked_add(wait);
        loop {
            let mut children: Vec<String> = node::list(&client, &dir)
                .await
                .map_err(zk_error)?
                .into_iter()
                .filter(same_lock)
                .collect();
            children.sort_unstable_by(|a, b| sequence(a).cmp(sequence(b)));
            let Some(at) = children.iter().position(|c| c == our_name) else {
                return Err(LockError::Store {
                    store: STORE,
                    message: format!("our contender node {ours} vanished (session expired?)"),
                });
            };
            let Some(before) = blocker(&children, at, mode) else {
                break;
            };
            if wait.is_zero() {
                return Ok(None);
            }
            let before = format!("{dir}/{before}");
            let watcher = match client.get_and_watch_data(&before).await {
                Ok((_, _, watcher)) => watcher,
                // Gone, or unknown after a lost connection: look at the queue again.
                Err(zk::Error::NoNode) => continue,
                Err(e) if node::Retry::new(&client).again(&e).await => continue,
                Err(e) => return Err(zk_error(e)),
            };
            let changed = watcher.changed();
            match deadline {
                Some(d) => {
                    if tokio::time::timeout_at(d, changed).await.is_err() {
                        return Ok(None);
                    }
                }
                None => {
                    changed.await;
                }
            }
        }
        leave.disarm();
        let token = u64::try_from(stat.czxid).unwrap_or_default();
        Ok(Some(ZkHold::start(client, name.to_owned(), ours, token)))
    }
}

impl Backend for ZkBackend {}

impl Seam for ZkBackend {
    type Grant = Arc<ZkHold>;

    fn kind(&self) -> StoreKind {
        StoreKind::Zookeeper
    }

    fn config(&self) -> &LockConfig {
        &self.config
    }

    // No downgrade: a writer queued behind our write node would be let in while our
    // read node, made after it, still holds (Curator lets that happen).
    const CAPABILITIES: Capabilities = Capabilities::KEPT_SESSIONS.with_shared(false);

    async fn take(
        &self,
        req: &Request,
        _seq: u64,
        deadline: Instant,
    ) -> Result<Taken<Self::Grant>, LockError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let dir = lock_path(&self.config.namespace, req.keys.name());
        let mode = req.keys.mode;
        Ok(
            match self.queue(req.keys.name(), (dir, mode), wait).await? {
                Some(hold) => Taken::Granted {
                    token: Some(FencingToken::new(hold.token(), hold.token())),
                    grant: Arc::new(hold),
                    valid: Validity::Kept,
                },
                None => Taken::busy_without_lease(&self.config),
            },
        )
    }

    async fn give_back(&self, _keys: &LockKeys, grant: &Self::Grant) -> Result<Held, LockError> {
        grant.delete().await
    }

    fn kept_for(&self, grant: &Self::Grant) -> Duration {
        grant.valid_for()
    }

    fn store_loss(
        &self,
        grant: &Self::Grant,
    ) -> Option<impl Future<Output = Option<Loss>> + Send + 'static> {
        Some(grant.lost())
    }

    async fn extend(
        &self,
        _keys: &LockKeys,
        grant: &Self::Grant,
        _lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        Ok(still(grant))
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, _channel: &'a str) -> Option<Listen<'a>> {
        // Waiters watch their predecessor, in `take`.
        None
    }
}

/// What a kept node proves now: its validity, or its loss.
fn still(grant: &ZkHold) -> Held<Instant> {
    let left = grant.valid_for();
    if left.is_zero() {
        Err(Loss::Expired)
    } else {
        Ok(Instant::now() + left)
    }
}

/// A random UUID (version 4 layout), as Curator names contender nodes.
fn uuid() -> String {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_err() {
        b = fastrand::u128(..).to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_one_escaped_segment_each() {
        assert_eq!(lock_path("lock", "order:7"), "/lock/order:7");
        assert_eq!(lock_path("lock", "a/b"), "/lock/a%2Fb");
        assert_eq!(lock_path("lock", ".."), "/lock/%2E%2E");
        assert_eq!(lock_path("lock", "x\u{1}y"), "/lock/x%01y");
        assert_eq!(lock_path("lock", "50%"), "/lock/50%25");
    }

    #[test]
    fn contenders_sort_by_sequence_whatever_their_uuid() {
        let mut c = [
            "_c_ffff-lock-0000000003",
            "_c_0000-lock-0000000010",
            "_c_aaaa-lock-0000000001",
        ];
        c.sort_unstable_by(|a, b| sequence(a).cmp(sequence(b)));
        assert_eq!(c[0], "_c_aaaa-lock-0000000001");
        assert_eq!(c[2], "_c_0000-lock-0000000010");
        // A read-write lock's readers and writers sort in one queue.
        let mut rw = [
            "_c_ffff-__WRIT__0000000012".to_owned(),
            "_c_0000-__READ__0000000011".to_owned(),
            "_c_aaaa-__READ__0000000013".to_owned(),
        ];
        rw.sort_unstable_by(|a, b| sequence(a).cmp(sequence(b)));
        assert_eq!(blocker(&rw, 0, LockMode::Read), None, "no writer before it");
        assert_eq!(blocker(&rw, 2, LockMode::Read), Some(&rw[1]));
        assert_eq!(blocker(&rw, 1, LockMode::Write), Some(&rw[0]));
        let u = uuid();
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
    }
}
