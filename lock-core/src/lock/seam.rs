//! The seam between the lock engine and a store: what each store alone knows (how to
//! take a grant, give it back, renew it, fence it, and where a waiter listens), and
//! nothing of the engine's bookkeeping (holds, reentrancy, leases by the local clock,
//! the watchdog's schedule, lost signals, background work), which stays in `core`,
//! `registry`, `acquire`, `watchdog` and the guard, written once for every store.
//!
//! A store implements [`Seam`] (crate-private: its methods speak the engine's own
//! types) and the public marker [`Backend`], so users can name `LockGuard<B>` and
//! bound code on `B: Backend` without seeing the seam. See `ARCHITECTURE.md` for what
//! the seam is designed to grow into (shared holds, queues, election, etcd).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::Request;
use super::registry::Loss;
use crate::client::cleanup;
use crate::client::config::LockConfig;
use crate::client::store::key::{LockKeys, LockMode};
use crate::client::wait::Listen;
use crate::error::LockError;
use crate::metrics::StoreKind;
use crate::owner::FencingToken;

/// What a store said about one grant: `Ok` while it is still the grant's, else how it
/// was lost. The outer `Result` of a seam call is whether the store answered at all.
pub(crate) type Held<T = ()> = Result<T, Loss>;

/// One grant's answer to a renewal of many: the validity it proves or how it was lost,
/// or an error that leaves this grant alone unknown (the store failed for its entry).
pub(crate) type Renewed = Result<Held<Instant>, LockError>;

/// How long a fresh grant is known to last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Validity {
    /// Until then, by the local clock (measured from before the request, less any
    /// allowance the store needs for clocks that drift apart).
    Until(Instant),
    /// As long as the store keeps it (a session that is the lease): the store reports
    /// its validity ([`Seam::kept_for`]) and its loss ([`Seam::store_loss`]).
    Kept,
}

/// A granted attempt, as the engine keeps it.
pub(crate) struct Granted<G> {
    pub(crate) grant: G,
    /// The engine's number of the attempt.
    pub(crate) seq: u64,
    /// Taken with the grant (a fenced request, or a grant through the script).
    pub(crate) token: Option<FencingToken>,
    pub(crate) valid: Validity,
    /// When the reply came in, by the local clock: the one reading the grant's lease
    /// check, its first renewal and its hold time all start from.
    pub(crate) arrived: Instant,
}

/// One attempt's answer.
pub(crate) enum Taken<G> {
    /// Granted: the store's record of the grant, its fencing token if it came with the
    /// grant, and how long it lasts.
    Granted {
        grant: G,
        token: Option<FencingToken>,
        valid: Validity,
    },
    /// Not granted: someone else holds it, and it changes within this long at the
    /// latest. `failure`: why this attempt could not grant, if not for a holder (too
    /// few nodes of a Redlock answered): reported if the wait ends on it.
    Busy {
        retry_after: Duration,
        failure: Option<LockError>,
    },
}

impl<G> Taken<G> {
    /// Busy on a store that tells no holder's lease (a session store): asked again
    /// after the first backoff step.
    #[cfg_attr(
        not(any(
            feature = "postgres",
            feature = "mysql",
            feature = "zookeeper",
            feature = "etcd"
        )),
        allow(dead_code)
    )]
    pub(crate) fn busy_without_lease(config: &LockConfig) -> Self {
        Self::Busy {
            retry_after: config.backoff.initial,
            failure: None,
        }
    }
}

/// In what order a store grants a lock to its waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// To whichever asks first after a release; no fair locks.
    Unordered,
    /// Every lock in arrival order: the server queues its waiters (a fair lock is any
    /// lock).
    Arrival,
    /// In arrival order for fair plain locks ([`Request::fair`]): the store keeps a
    /// line of their waiters, each place kept by the waiter's attempts; the waiter is
    /// asked to [`leave`](Seam::leave) when its acquisition ends without a grant.
    Line,
}

/// What a store can and cannot do, checked by the engine before it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Capabilities {
    /// The engine's watchdog renews (or checks) watched grants and ends fixed leases
    /// (`false`: the store keeps a watched grant itself, and a fixed lease ends by the
    /// local clock alone).
    pub(crate) renews: bool,
    /// A fixed lease and a max-hold apply (`false`: a session store, whose grants last
    /// as long as their session; every grant is then watched, without a cap).
    pub(crate) fixed_leases: bool,
    /// Read and write holds ([`LockMode`](crate::LockMode)): `false`, the engine
    /// refuses them before any call.
    pub(crate) shared: bool,
    /// A scope holding the write hold may take a read hold too (`false`: the engine
    /// refuses it, rather than let it wait for its own writer).
    pub(crate) downgrade: bool,
    /// The store keeps a value beside a hold ([`LockOptions::value`](crate::LockOptions::value);
    /// `false`: the engine refuses one before any call).
    pub(crate) values: bool,
    /// In what order waiters are granted, and whether fair locks are offered.
    pub(crate) order: Order,
}

impl Capabilities {
    /// Leases in the store, renewed by the watchdog (Redis).
    pub(crate) const RENEWED_LEASES: Self = Self {
        renews: true,
        fixed_leases: true,
        shared: false,
        downgrade: false,
        values: false,
        order: Order::Line,
    };
    /// Leases on the local clock; watched grants kept until given back (memory).
    pub(crate) const LOCAL_LEASES: Self = Self {
        renews: false,
        fixed_leases: true,
        shared: false,
        downgrade: false,
        values: false,
        order: Order::Line,
    };
    /// A session per grant, checked by the watchdog (PostgreSQL, MySQL), or a session
    /// lease the watchdog keeps alive (etcd).
    #[cfg_attr(
        not(any(feature = "postgres", feature = "mysql", feature = "etcd")),
        allow(dead_code)
    )]
    pub(crate) const CHECKED_SESSIONS: Self = Self {
        renews: true,
        fixed_leases: false,
        shared: false,
        downgrade: false,
        values: false,
        order: Order::Arrival,
    };
    /// A session that keeps its grants and reports their loss (ZooKeeper).
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    pub(crate) const KEPT_SESSIONS: Self = Self {
        renews: false,
        fixed_leases: false,
        shared: false,
        downgrade: false,
        values: false,
        order: Order::Arrival,
    };
}

impl Capabilities {
    /// These, with read and write holds (`downgrade`: and a writer's read hold).
    pub(crate) const fn with_shared(self, downgrade: bool) -> Self {
        Self {
            shared: true,
            downgrade,
            ..self
        }
    }

    /// These, without fair locks (a store made of stores that each keep their own line).
    pub(crate) const fn unordered(self) -> Self {
        Self {
            order: Order::Unordered,
            ..self
        }
    }

    /// Whether a fair request in `mode` is granted in arrival order here.
    pub(crate) fn fair(self, mode: LockMode) -> bool {
        match self.order {
            Order::Arrival => true,
            Order::Line => mode == LockMode::Exclusive,
            Order::Unordered => false,
        }
    }

    /// These, with a value kept beside each hold.
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    pub(crate) const fn with_values(self) -> Self {
        Self {
            values: true,
            ..self
        }
    }
}

/// `backend`'s give-back of `grant` for background work, tried again after a failure
/// ([`cleanup::patiently`]: it gives back only this grant). After a failed try,
/// `Expired` means that try may have given it back: reported as given back.
pub(crate) async fn give_back_patiently<B: Seam>(
    backend: &B,
    keys: &LockKeys,
    grant: &B::Grant,
) -> Result<Held, LockError> {
    let call = || backend.give_back(keys, grant);
    match cleanup::patiently("a background release", call).await {
        (Ok(Err(Loss::Expired)), true) => Ok(Ok(())),
        (answer, _) => answer,
    }
}

/// A lock store the engine can run on. Sealed: implemented by this crate's stores
/// ([`RedisBackend`](crate::RedisBackend) for one Redis node or a Cluster,
/// [`MemoryBackend`](crate::MemoryBackend) for this process), and named in
/// types such as [`LockGuard<MemoryBackend>`](crate::LockGuard).
#[allow(private_bounds)] // the seam is crate-private on purpose: this trait is sealed by it
pub trait Backend: Seam {}

/// What a store implements for the engine. Every call that touches a grant compares
/// the grant's record first, so it can only touch its own grant.
pub(crate) trait Seam: Send + Sync + Sized + 'static {
    /// The store's record of one grant (a Redis value, a map entry's number).
    type Grant: Clone + Send + Sync + 'static;

    /// The `store` label of its metrics.
    fn kind(&self) -> StoreKind;

    /// The configuration in force.
    fn config(&self) -> &LockConfig;

    /// What the store can and cannot do.
    const CAPABILITIES: Capabilities;

    /// One attempt to take `req`'s lock as the engine's grant number `seq`. `deadline`:
    /// when the caller's wait budget ends (now or past: it will not wait); a store that
    /// waits inside the server may wait until then before it answers busy. A deadline,
    /// not what is left of it, so the store reads the clock once, when it sends. A
    /// grant whose outcome is unknown (cancelled or failed mid-call) is the store's to
    /// give back.
    fn take(
        &self,
        req: &Request,
        seq: u64,
        deadline: Instant,
    ) -> impl Future<Output = Result<Taken<Self::Grant>, LockError>> + Send;

    /// Gives a grant back: `Ok(Ok(()))` if it was still this grant's. Safe to repeat.
    fn give_back(
        &self,
        keys: &LockKeys,
        grant: &Self::Grant,
    ) -> impl Future<Output = Result<Held, LockError>> + Send;

    /// Gives a grant back at once, without I/O, where the store can (`None`: the
    /// engine calls [`give_back`](Self::give_back) in the background).
    fn give_back_now(&self, _keys: &LockKeys, _grant: &Self::Grant) -> Option<Held> {
        None
    }

    /// Lets a grant run out on its own (no release, no renewal). The default does
    /// nothing: the store's lease ends it. Asked only of stores with
    /// [`fixed_leases`](Capabilities::fixed_leases): a session has no lease to run out,
    /// so the engine gives a session store's grant back instead.
    fn let_expire(&self, _keys: &LockKeys, _grant: &Self::Grant) {}

    /// Keeps a fixed-lease grant until it is given back, as the store keeps its
    /// watched grants: a watched hold re-entered it. Asked only of stores that keep
    /// watched grants themselves ([`fixed_leases`](Capabilities::fixed_leases) without
    /// [`renews`](Capabilities::renews)), which must answer it; the default, for the
    /// others, keeps nothing and says so.
    fn keep(&self, _keys: &LockKeys, _grant: &Self::Grant) -> Held {
        Err(Loss::Expired)
    }

    /// How long a kept grant ([`Validity::Kept`]) is known to last from now (zero:
    /// lost). The default: the watchdog lease, for a store that keeps a grant until it
    /// is given back.
    fn kept_for(&self, _grant: &Self::Grant) -> Duration {
        self.config().watchdog_lease()
    }

    /// Where the store reports the loss of a grant by itself (a session expired, a node
    /// or key deleted): a future that resolves with the loss, or with `None` once the
    /// grant is gone unlost. `None` here: the store never reports one (the watchdog's
    /// renewal, if any, finds it).
    fn store_loss(
        &self,
        _grant: &Self::Grant,
    ) -> Option<impl Future<Output = Option<Loss>> + Send + 'static> {
        None::<std::future::Pending<Option<Loss>>>
    }

    /// Lengthens a grant's lease to `lease` from now, never shortening it; answers the
    /// validity it proves.
    fn extend(
        &self,
        keys: &LockKeys,
        grant: &Self::Grant,
        lease: Duration,
    ) -> impl Future<Output = Result<Held<Instant>, LockError>> + Send;

    /// Renews many grants (all of one [`group`](Self::group)) to `lease` in one call
    /// bounded by `within`: one answer per grant, in order, each with the validity it
    /// proves, or the error of its entry alone, so that one grant's failure does not
    /// leave the others unrenewed. The outer error: the call failed as a whole. Only
    /// asked where [`renews`](Capabilities::renews); the default extends each grant,
    /// all at once.
    fn renew(
        &self,
        grants: &[(&LockKeys, &Self::Grant)],
        lease: Duration,
        _within: Duration,
    ) -> impl Future<Output = Result<Vec<Renewed>, LockError>> + Send {
        let extends = grants
            .iter()
            .map(move |(keys, grant)| self.extend(keys, grant, lease));
        async move { Ok(futures_util::future::join_all(extends).await) }
    }

    /// The renewal group of `key`: grants of one group renew in one call.
    fn group(&self, _key: &str) -> u16 {
        0
    }

    /// The fencing token of a grant (number `seq`) that came without one, taken now if
    /// it still holds the lock. The default is for a store that gives every grant its
    /// token when it grants it, so the engine never asks.
    fn fence(
        &self,
        keys: &LockKeys,
        _grant: &Self::Grant,
        _seq: u64,
    ) -> impl Future<Output = Result<Held<FencingToken>, LockError>> + Send {
        std::future::ready(Err(LockError::NoFencingToken {
            key: keys.name().to_owned(),
            reason: "this store gives a grant its token when it grants it",
        }))
    }

    /// Where a waiter for `keys` listens (`channel`: the waiter's channel name, built
    /// by the caller only when it first waits); `None`: between attempts it sleeps its
    /// backoff (a store that waits inside the server, in `take`).
    fn listen<'a>(&'a self, keys: &LockKeys, channel: &'a str) -> Option<Listen<'a>>;

    /// The channel name a waiter for `req` listens on, where [`listen`](Self::listen)
    /// needs one (a fair waiter: its own, where the line wakes its head).
    fn channel(&self, _req: &Request) -> String {
        String::new()
    }

    /// Takes `req`'s waiter out of the lock's line (its acquisition ended without a
    /// grant), waking the next waiter if it is now first; nothing if it never queued.
    /// Asked only for fair requests on stores with [`Order::Line`]; a waiter that
    /// never leaves lapses after its place lease.
    fn leave(&self, _req: &Request) -> impl Future<Output = Result<(), LockError>> + Send {
        std::future::ready(Ok(()))
    }
}
