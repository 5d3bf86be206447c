//! [`EtcdLocks`]: locks on etcd in the layout of etcd's own Go `concurrency` package,
//! through `etcd-client`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod contender;
mod hold;
mod members;
mod session;
mod turns;
mod values;

use etcd_client as etcd;
use tokio::time::Instant;

use self::contender::{Queue, Queued};
use self::hold::{EtcdHold, Leave};
use self::members::Members;
use self::session::{KeptAlive, Lease, Session};
use self::turns::Turns;
pub use self::values::EtcdHolder;
use crate::client::cleanup;
use crate::client::config::LockConfig;
use crate::client::store::key::{self, LockKeys, LockMode, LockName};
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::lock::registry::Loss;
use crate::lock::seam::{Backend, Capabilities, Held, Renewed, Seam, Taken, Validity};
use crate::lock::{LockGuard, Request};
use crate::metrics::StoreKind;
use crate::owner::FencingToken;
use crate::stores::locks::Locks;
use crate::stores::path;

/// The guard of an [`EtcdLocks`] lock: the engine's guard on etcd.
pub type EtcdGuard = LockGuard<EtcdBackend>;

const STORE: &str = "etcd";

/// The fencing token of a contender key created at revision `created`: revisions only
/// grow across the cluster.
fn token(created: i64) -> FencingToken {
    let rev = u64::try_from(created).unwrap_or_default();
    FencingToken::new(rev, rev)
}

/// How long a grant is held before a watch reports its key's deletion: a hold given
/// back sooner costs no watch, and a deletion within it is reported at its end.
const DELETION_WATCH_AFTER: Duration = Duration::from_millis(250);

/// Locks on etcd, key for key as etcd's Go `concurrency.Mutex` lays them out, so a Go
/// service using `concurrency.NewMutex(session, prefix)` and a Rust service using this
/// crate exclude each other on the same prefix ([`EtcdLocks::lock_prefix`] says which).
///
/// - **Layout**: one session lease per `EtcdLocks`; a contender key
///   `<lock prefix>/<lease id in hex>` is created under it in a transaction guarded by
///   `CreateRevision == 0`; the owner is the oldest such key (lowest create revision),
///   and each waiter watches only the deletion of the key created just before its own
///   (no herd). The lock prefix is `<root>/<namespace>/<name>`, the root from
///   the connect string (`/` and `%` in the namespace and name percent-escaped).
/// - **Lease**: the session lease's TTL is the config's watchdog lease (whole seconds,
///   at least the server's minimum), kept alive by the watchdog while a lock is held
///   and by waiters while they wait. [`LockGuard::valid_for`] is what the last
///   confirmed keep-alive proves.
/// - **Loss**: [`LockGuard::lost`] fires when no keep-alive confirms the lease before
///   its TTL runs out (the server then deletes the key), or when the key is deleted (by
///   hand, or with a revoked lease): a holder watches its key once it has held it for
///   250 ms (a deletion sooner is reported then), and each renewal looks at it too.
/// - **Fencing tokens** are the contender key's create revision: revisions only grow
///   across the cluster, so each new owner's token is larger.
///   [`EtcdLocks::write_fenced`] runs a write in one transaction with
///   `If(CreateRevision(lock key) == token)`.
/// - **Within one client**, the scopes asking for one lock take turns before they
///   queue in etcd (they would share the client's key).
/// - **Read-write locks** ([`LockOptions::read`](crate::LockOptions::read), `write`) in
///   the Go `recipe.RWMutex` layout: a key per hold, `<lock prefix>/read/<id>` or
///   `<lock prefix>/write/<id>`, under the session lease; a writer waits for every
///   older reader and writer, a reader for older writers only. No downgrade. It is
///   another lock than the plain lock of its name (each waits behind its own kind of
///   key; a Go `RWMutex` writer on the same prefix would also wait for plain holders).
/// - **Values**: a hold keeps [`LockOptions::value`](crate::LockOptions::value) as its
///   key's value, as Go's `Election.Campaign` does; [`EtcdLocks::holder`] reads the
///   holder's (Go's `Election.Leader`), [`EtcdLocks::proclaim`] replaces it.
/// - **Leases** from [`Lease::Fixed`](crate::Lease::Fixed) are not applied (the key
///   lives with the session), nor a max-hold; `hold_until_expiry` releases.
/// - **Quorum loss**: calls fail with [`LockError::Store`] (the client asks for a
///   leader), and a holder's `lost()` fires once its lease can no longer be confirmed.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{EtcdLocks, LockConfig};
///
/// let locks = EtcdLocks::connect("etcd1:2379,etcd2:2379,etcd3:2379/app", LockConfig::new())
///     .await?;
/// let guard = locks.lock(("report", 2026_u32)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
pub type EtcdLocks = Locks<EtcdBackend>;

/// The backend of [`EtcdLocks`]: Go-layout contender keys under one session lease.
pub struct EtcdBackend {
    members: Arc<Members>,
    /// What every lock prefix starts with: `""` or `/<root>`.
    root: String,
    config: LockConfig,
    session: Session,
    turns: Turns,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("root", &self.root)
            .field("members", &self.members)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

pub(super) fn etcd_error(e: etcd::Error) -> LockError {
    LockError::Store {
        store: STORE,
        message: e.to_string(),
    }
}

/// `call` bounded by `within`: a call past it is an error that says what timed out.
pub(super) async fn timed<T>(
    what: &str,
    within: Duration,
    call: impl Future<Output = T>,
) -> Result<T, LockError> {
    tokio::time::timeout(within, call)
        .await
        .map_err(|_| LockError::Store {
            store: STORE,
            message: format!("{what}: no answer within {within:?}"),
        })
}

/// Splits `[etcd://]host:port[,host:port...][/root]` into endpoints and the root
/// (`""` or `/root`, without a trailing `/`).
fn parse_cluster(cluster: &str) -> Result<(Vec<String>, String), LockError> {
    let cluster = cluster.strip_prefix("etcd://").unwrap_or(cluster);
    let (hosts, root) = cluster.split_once('/').unwrap_or((cluster, ""));
    let endpoints: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| format!("http://{h}"))
        .collect();
    if endpoints.is_empty() {
        return Err(LockError::InvalidConfig(format!(
            "no etcd endpoint in {cluster:?}; expected host:port[,host:port...][/prefix]"
        )));
    }
    Ok((endpoints, rooted(root)))
}

/// A root as every lock prefix starts with it: `""`, or `/root` without a trailing `/`.
fn rooted(root: &str) -> String {
    match root.trim_matches('/') {
        "" => String::new(),
        r => format!("/{r}"),
    }
}

impl Locks<EtcdBackend> {
    /// Connects to the cluster `host:port[,host:port...][/root]` (`etcd://` in front
    /// optional, as in an [`AnyLocks`](crate::AnyLocks) URL; requests go to any
    /// member that answers; each asks for a leader, so a member cut off from the
    /// quorum answers an error at once). The root, if any, starts every lock prefix.
    /// The connections run on the caller's runtime; once that runtime has ended, the
    /// next call connects again on its own, so the locks outlive the runtime that made
    /// them (a lock held meanwhile is renewed from the process's background runtime).
    pub async fn connect(cluster: &str, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let (endpoints, root) = parse_cluster(cluster)?;
        let options = etcd::ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(config.command_timeout);
        // One client per member, so that a call can move on from one that hangs.
        // Boxed: gRPC's connect futures are large, and callers nest this one.
        let members = Box::pin(Members::connect(endpoints, options, config.command_timeout));
        let members = members.await?;
        Ok(Self::build(members, root, config))
    }

    /// Locks on a client of yours, under `root` (`""`, or a prefix such as `/app`).
    /// The client's own options apply (ask for a leader,
    /// `ConnectOptions::with_require_leader`, to fail fast when the quorum is lost).
    /// It is used as it is, never connected again: it must outlive the locks' use,
    /// its runtime included.
    pub fn new(client: etcd::Client, root: &str, config: LockConfig) -> Result<Self, LockError> {
        config.validate()?;
        let members = Members::handed_in(client, config.command_timeout);
        Ok(Self::build(members, rooted(root), config))
    }

    fn build(members: Members, root: String, config: LockConfig) -> Self {
        let session = Session::new(config.watchdog_lease());
        Self::over(EtcdBackend {
            members: Arc::new(members),
            root,
            config,
            session,
            turns: Turns::default(),
        })
    }

    /// The prefix under which contenders for `name` queue: what a Go service passes to
    /// `concurrency.NewMutex(session, prefix)` to share the lock.
    pub fn lock_prefix<N: LockName>(&self, name: N) -> Result<String, LockError> {
        let config = self.config();
        let name = key::escaped_name(&config.delimiter, &name)?;
        Ok(self.backend().lock_prefix(&name))
    }
}

/// Where a hold's key goes and what it waits for, as the Go packages lay them out:
/// `concurrency.Mutex` (a key per session, `<lock>/<lease id in hex>`, behind every
/// older such key) and `recipe.RWMutex` (a key per hold under `<lock>/read/` or
/// `<lock>/write/`; a writer behind every older reader and writer, a reader behind
/// older writers only). A plain lock and a read-write lock of one name are two locks:
/// each waits behind its own kind of key only (the Go packages, given one prefix,
/// would mix them).
struct Layout {
    /// The prefix of our key.
    mine: String,
    /// One key per grant (`<lease>-<grant>`), not per session.
    per_grant: bool,
    /// The keys that hold us back.
    blockers: Queue,
}

impl Layout {
    fn of(lock: &str, mode: LockMode) -> Self {
        // Lease ids are lowercase hex: a plain lock's keys sort before `<lock>/g`, and
        // `read/` and `write/` after it.
        let (mine, blockers) = match mode {
            LockMode::Exclusive => ("/", ("/", "/g")),
            LockMode::Read => ("/read/", ("/write/", "/write0")),
            LockMode::Write => ("/write/", ("/read/", "/write0")),
        };
        Self {
            mine: format!("{lock}{mine}"),
            per_grant: mode != LockMode::Exclusive,
            blockers: Queue {
                start: format!("{lock}{}", blockers.0),
                end: format!("{lock}{}", blockers.1),
            },
        }
    }
}

impl EtcdBackend {
    fn lock_prefix(&self, name: &str) -> String {
        format!(
            "{}/{}/{}",
            self.root,
            path::segment(&self.config.namespace),
            path::segment(name)
        )
    }

    /// How long a lease must still last when a grant starts: longer than the
    /// watchdog's first renewal and the time it takes.
    fn fresh_for(&self) -> Duration {
        self.config.watchdog_lease() * 2 / 3
    }

    /// One acquisition (grant number `seq`), as `take` describes it.
    async fn contend(
        &self,
        (name, mode, seq): (&str, LockMode, u64),
        value: &[u8],
        wait: Duration,
    ) -> Result<Option<EtcdHold>, LockError> {
        let deadline = Instant::now().checked_add(wait);
        let lock = self.lock_prefix(name);
        let layout = Layout::of(&lock, mode);
        // A read-write lock's keys are one per grant: no turns to take between scopes.
        let turn_name = match mode {
            LockMode::Exclusive => name.to_owned(),
            _ => format!("{lock}/{seq:x}"),
        };
        let Some(turn) = self.turns.take(&turn_name, wait).await else {
            return Ok(None);
        };
        let queue = layout.blockers;
        let (lease_id, key, queued, mut leave) = {
            let mut turn = turn;
            let mut retried = false;
            loop {
                let lease = self.session.lease(&self.members, self.fresh_for()).await?;
                let key = if layout.per_grant {
                    format!("{}{:x}-{seq:x}", layout.mine, lease.id)
                } else {
                    format!("{}{:x}", layout.mine, lease.id)
                };
                let leave = Leave::arm(self.members.clone(), key.clone(), lease.ttl, turn);
                match contender::enqueue(&self.members, (&queue, &key, value), lease).await? {
                    Some(queued) => break (lease.id, key, queued, leave),
                    // Refused for its lease (expired meanwhile): nothing was made.
                    None if !retried => {
                        retried = true;
                        self.session.forget(lease.id).await;
                        turn = leave.keep();
                    }
                    None => {
                        return Err(LockError::Store {
                            store: STORE,
                            message: "etcd refused a fresh session lease as not found".into(),
                        });
                    }
                }
            }
        };
        // Known now: a late delete must not take a key made again under the same name.
        leave.made(match queued {
            Queued::Owner(rev) | Queued::Behind(rev) => rev,
        });
        let token = match queued {
            Queued::Owner(rev) => rev,
            Queued::Behind(rev) => {
                let granted = match deadline {
                    Some(deadline) if !wait.is_zero() => {
                        self.wait_behind(&queue, rev, deadline).await?
                    }
                    _ => false,
                };
                if !granted {
                    leave.now().await?;
                    return Ok(None);
                }
                // The key may have gone with the lease while we waited.
                if !contender::is_there(&self.members, key.as_bytes(), rev).await? {
                    return Err(LockError::Store {
                        store: STORE,
                        message: "our contender key was deleted while we waited (the session \
                                  lease expired, or someone deleted it)"
                            .into(),
                    });
                }
                rev
            }
        };
        // Kept alive while we waited: what it is known to last now.
        let lease = self.session.lease(&self.members, self.fresh_for()).await?;
        if lease.id != lease_id {
            return Err(LockError::Store {
                store: STORE,
                message: "the session lease was lost while we waited".into(),
            });
        }
        Ok(Some(EtcdHold::new(key, lease, token, leave.keep())))
    }

    /// Waits behind the keys created before ours, keeping the lease alive meanwhile:
    /// `true` once they are all gone, `false` at `deadline`.
    async fn wait_behind(
        &self,
        queue: &Queue,
        ours: i64,
        deadline: Instant,
    ) -> Result<bool, LockError> {
        let recheck = self.config.watchdog_lease();
        let waiting = contender::await_predecessors(&self.members, queue, ours, deadline, recheck);
        let keeping = async {
            let tick = self.config.watchdog_lease() / 6;
            loop {
                tokio::time::sleep(tick).await;
                if let Err(e) = self.session.lease(&self.members, self.fresh_for()).await {
                    tracing::debug!(error = %e, "keeping the etcd session alive while waiting failed");
                }
            }
        };
        tokio::select! {
            granted = waiting => granted,
            () = keeping => Ok(false),
        }
    }

    /// What the server says of `grants` now: each one's validity, or its loss.
    async fn check(&self, grants: &[&EtcdHold]) -> Result<Vec<Held<Instant>>, LockError> {
        let mut leases: Vec<Lease> = Vec::new();
        for g in grants {
            if !leases.iter().any(|l| l.id == g.lease.id) {
                leases.push(g.lease);
            }
        }
        let kept = futures_util::future::join_all(
            leases.iter().map(|l| self.session.renew(&self.members, *l)),
        );
        let keys: Vec<(&[u8], i64)> = grants.iter().map(|g| (g.key.as_bytes(), g.token)).collect();
        let (kept, there) = tokio::join!(kept, contender::still_there(&self.members, &keys));
        let kept: Vec<KeptAlive> = kept.into_iter().collect::<Result<_, _>>()?;
        let there = there?;
        Ok(grants
            .iter()
            .zip(there)
            .map(|(g, there)| {
                let at = leases.iter().position(|l| l.id == g.lease.id);
                match (at.map(|i| &kept[i]), there) {
                    (Some(KeptAlive::Until(t)), true) => Ok(*t),
                    _ => Err(Loss::Expired),
                }
            })
            .collect())
    }
}

impl Backend for EtcdBackend {}

impl Seam for EtcdBackend {
    type Grant = Arc<EtcdHold>;

    fn kind(&self) -> StoreKind {
        StoreKind::Etcd
    }

    fn config(&self) -> &LockConfig {
        &self.config
    }

    // No downgrade: a writer's own read key would queue behind its write key.
    const CAPABILITIES: Capabilities = Capabilities::CHECKED_SESSIONS
        .with_shared(false)
        .with_values();

    async fn take(
        &self,
        req: &Request,
        seq: u64,
        deadline: Instant,
    ) -> Result<Taken<Self::Grant>, LockError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        let value = req.value.as_deref().unwrap_or_default();
        let contender = (req.keys.name(), req.keys.mode, seq);
        Ok(match self.contend(contender, value, wait).await? {
            Some(hold) => Taken::Granted {
                token: Some(token(hold.token)),
                valid: Validity::Until(hold.lease.valid_until),
                grant: Arc::new(hold),
            },
            None => Taken::busy_without_lease(&self.config),
        })
    }

    async fn give_back(&self, _keys: &LockKeys, grant: &Self::Grant) -> Result<Held, LockError> {
        grant.give_back(&self.members).await
    }

    async fn extend(
        &self,
        _keys: &LockKeys,
        grant: &Self::Grant,
        _lease: Duration,
    ) -> Result<Held<Instant>, LockError> {
        let mut answers = self.check(&[grant]).await?;
        answers
            .pop()
            .ok_or_else(|| contender::unexpected("no answer for our key"))
    }

    async fn renew(
        &self,
        grants: &[(&LockKeys, &Self::Grant)],
        _lease: Duration,
        within: Duration,
    ) -> Result<Vec<Renewed>, LockError> {
        let holds: Vec<&EtcdHold> = grants.iter().map(|(_, g)| &***g).collect();
        let held = timed("renewing the session lease", within, self.check(&holds)).await??;
        Ok(held.into_iter().map(Ok).collect())
    }

    fn store_loss(
        &self,
        grant: &Self::Grant,
    ) -> Option<impl Future<Output = Option<Loss>> + Send + 'static> {
        Some(hold::deletion(
            self.members.clone(),
            grant,
            DELETION_WATCH_AFTER,
            self.config.watchdog_lease(),
        ))
    }

    fn listen<'a>(&'a self, _keys: &LockKeys, _channel: &'a str) -> Option<Listen<'a>> {
        // Waiters watch their predecessor, in `take`.
        None
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        // Every guard is gone (each keeps the backend): the lease's keys can go now
        // rather than at its TTL.
        let Some(lease) = self.session.current() else {
            return;
        };
        let members = self.members.clone();
        cleanup::spawn("revoking the etcd session", String::new(), async move {
            members
                .call("revoking the session lease", |c| async move {
                    c.lease_client().revoke(lease.id).await
                })
                .await
                .map(drop)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings_give_endpoints_and_a_root() {
        let (e, root) = parse_cluster("a:2379,b:2379/app/").unwrap();
        assert_eq!(e, ["http://a:2379", "http://b:2379"]);
        assert_eq!(root, "/app");
        let (e, root) = parse_cluster("etcd://a:2379").unwrap();
        assert_eq!(e, ["http://a:2379"]);
        assert_eq!(root, "");
        assert!(matches!(
            parse_cluster("/app"),
            Err(LockError::InvalidConfig(_))
        ));
    }
}
