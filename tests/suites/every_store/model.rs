//! A seeded randomized test against a model, on every lock store: many tasks in a few
//! scopes on two handles of one store interleave lock (plain or fair) / re-enter / drop /
//! release / cancel / timeout on a few names, with short leases. A checker looks at every guard
//! alive, over and over, and fails on any instant where
//! - two different grants of one name both believe they hold it (`valid_for()` left), or
//! - on one Redis node and a Redis Cluster (our layout or Redisson's), a guard believes it
//!   holds a name while the server shows another grant (or none), or (our layout) while
//!   the key's expiry comes sooner than the guard's belief ends.
//!
//! Reproduce a failure with `MODEL_SEED=<seed> cargo test -p lock-tests --test
//! every_store -- model::`; the seed is printed at the start of every run.

use std::any::Any;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common;

use lock_core::{AnyGuard, AnyLocks, HeldLock, Lease, LockConfig, LockOptions, LockScope};
use lock_tests::{
    EtcdCluster, MariaDbServer, PostgresServer, RedisCluster, RedisServer, ZooKeeperServer,
};

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
/// A guard counts as believing it holds only with this much validity left, so that
/// the checker's own delay cannot make a true belief look false.
const MARGIN: Duration = Duration::from_millis(3);

/// The guards one task holds right now, where the checker can see them.
type Held = Arc<Mutex<Guards>>;

#[derive(Default)]
struct Guards {
    list: Vec<AnyGuard>,
    /// Guards taken out of `list` so far: a Redisson grant is known only by its field,
    /// which the scope's next grant shares, so the checker tells a grant that lived
    /// through its read from a later one by this count not moving.
    taken_out: u64,
}

impl Guards {
    fn take_any(&mut self, rng: &mut fastrand::Rng) -> Option<AnyGuard> {
        let n = self.list.len();
        (n > 0).then(|| {
            self.taken_out += 1;
            self.list.swap_remove(rng.usize(0..n))
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One store under test: two handles (clients, pools or sessions; for memory, two
/// clones of one store, since two memory stores never exclude each other), the
/// servers they run on, and where the checker can read a name's grant on the server.
pub(super) struct Backend {
    pub(super) locks: [AnyLocks; 2],
    server: Option<Server>,
    /// Whether the store applies `Lease::Fixed`. The session stores (PostgreSQL,
    /// MySQL, ZooKeeper) do not: a grant lives with its session, so a fixed lease would
    /// only be a guard's belief the store never enforces, and the model asks for the
    /// watchdog there.
    pub(super) fixed_leases: bool,
    _keep: Box<dyn Any>,
}

/// Where the grants of a Redis store can be read back: a connection, and whether the
/// store writes Redisson's layout (a hold is a field of the hash at the name) or ours
/// (the grant's value at the key).
struct Server {
    conn: Conn,
    redisson: bool,
}

enum Conn {
    Node(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Server {
    /// Whether `grant` holds `key` on the server, and the key's PTTL, read together.
    async fn shows(&mut self, key: &str, grant: &str) -> (bool, i64) {
        let mut pipe = redis::pipe();
        pipe.atomic();
        if self.redisson {
            pipe.cmd("HEXISTS").arg(key).arg(grant);
        } else {
            pipe.cmd("GET").arg(key);
        }
        pipe.cmd("PTTL").arg(key);
        let (holder, pttl): (redis::Value, i64) = match &mut self.conn {
            Conn::Node(c) => pipe.query_async(c).await.unwrap(),
            Conn::Cluster(c) => pipe.query_async(c).await.unwrap(),
        };
        let holds = match holder {
            redis::Value::Int(n) => n == 1,
            redis::Value::BulkString(v) => v == grant.as_bytes(),
            _ => false,
        };
        (holds, pttl)
    }
}

/// Two handles on the store at `url`.
async fn open_two(url: &str, config: &LockConfig) -> [AnyLocks; 2] {
    let open = || async { AnyLocks::open(url, config.clone()).await.expect(url) };
    [open().await, open().await]
}

fn redis_config(batching: bool) -> LockConfig {
    LockConfig::new()
        .with_batching(batching)
        .with_watchdog_lease(Duration::from_millis(150))
        .with_command_timeout(Duration::from_secs(2))
}

pub(super) async fn redis(batching: bool) -> Backend {
    let server = RedisServer::start();
    let locks = open_two(&server.url(), &redis_config(batching)).await;
    Backend {
        locks,
        server: Some(Server {
            conn: Conn::Node(server.connection().await),
            redisson: false,
        }),
        fixed_leases: true,
        _keep: Box::new(server),
    }
}

pub(super) async fn cluster() -> Backend {
    let cluster = RedisCluster::start(3, 0);
    let url = format!("redis+cluster://{}", cluster.hosts());
    let locks = open_two(&url, &redis_config(true)).await;
    Backend {
        locks,
        server: Some(Server {
            conn: Conn::Cluster(cluster.connection().await),
            redisson: false,
        }),
        fixed_leases: true,
        _keep: Box::new(cluster),
    }
}

/// Redisson's layout on one Redis node, or (`cluster`) on a Cluster of 3 masters. The
/// checker reads a hold back as its field in the hash at the name.
pub(super) async fn redisson(cluster: bool) -> Backend {
    let (url, conn, keep): (String, Conn, Box<dyn Any>) = if cluster {
        let cluster = RedisCluster::start(3, 0);
        (
            format!("redisson+cluster://{}", cluster.hosts()),
            Conn::Cluster(cluster.connection().await),
            Box::new(cluster),
        )
    } else {
        let server = RedisServer::start();
        (
            format!("redisson://127.0.0.1:{}", server.port()),
            Conn::Node(server.connection().await),
            Box::new(server),
        )
    };
    Backend {
        locks: open_two(&url, &redis_config(true)).await,
        server: Some(Server {
            conn,
            redisson: true,
        }),
        fixed_leases: true,
        _keep: keep,
    }
}

/// Redlock over 3 masters. The checker reads no node back: a minority of them may miss
/// a copy by design, and the quorum is what the belief check holds to.
pub(super) async fn redlock() -> Backend {
    let masters = RedisServer::start_many(3);
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let url = format!("redlock://{}", hosts.join(","));
    let locks = open_two(&url, &redis_config(true)).await;
    Backend {
        locks,
        server: None,
        fixed_leases: true,
        _keep: Box::new(masters),
    }
}

pub(super) fn memory() -> Backend {
    let store = lock_core::MemoryLocks::with_config(
        LockConfig::new().with_watchdog_lease(Duration::from_millis(150)),
    )
    .unwrap();
    Backend {
        locks: [store.clone().into(), store.into()],
        server: None,
        fixed_leases: true,
        _keep: Box::new(()),
    }
}

/// PostgreSQL and MySQL: a guard believes in at most 800 ms past its session's last
/// check, made every 200 ms.
fn sql_config() -> LockConfig {
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(800))
        .with_watchdog_period(Duration::from_millis(200))
        .with_command_timeout(Duration::from_secs(2))
}

pub(super) async fn postgres() -> Backend {
    let server = PostgresServer::start();
    let locks = open_two(&server.url(), &sql_config()).await;
    Backend {
        locks,
        server: None,
        fixed_leases: false,
        _keep: Box::new(server),
    }
}

pub(super) async fn mysql() -> Backend {
    let server = MariaDbServer::start();
    let locks = open_two(&server.url(), &sql_config()).await;
    Backend {
        locks,
        server: None,
        fixed_leases: false,
        _keep: Box::new(server),
    }
}

pub(super) async fn zookeeper() -> Backend {
    let server = ZooKeeperServer::start();
    // The watchdog lease is the session timeout.
    let config = LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(1_500))
        .with_command_timeout(Duration::from_secs(2));
    let locks = open_two(&format!("zk://{}", server.connect_string()), &config).await;
    Backend {
        locks,
        server: None,
        fixed_leases: false,
        _keep: Box::new(server),
    }
}

pub(super) async fn etcd() -> Backend {
    let cluster = EtcdCluster::start(3);
    // A 2 s session lease (whole seconds), as the etcd suite uses.
    let config = LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(1_500))
        .with_command_timeout(Duration::from_secs(2));
    let locks = open_two(&cluster.url("model"), &config).await;
    Backend {
        locks,
        server: None,
        fixed_leases: false,
        _keep: Box::new(cluster),
    }
}

/// The grant a guard of handle `handle` belongs to: guards of one grant share it, two
/// grants never do. Redis guards carry the value stored on the server. A Redlock grant
/// is its handle and scope (the owner is `<node client id>:<scope>`, and the node it is
/// read from may differ between holds of one grant): a scope's holds of one name share
/// one grant while any is alive. The other stores' grants are told apart by their
/// handle and fencing token (a token is unique per grant within one store, and two
/// stores that do not share must not look alike).
fn grant(handle: usize, g: &AnyGuard) -> Option<String> {
    match g {
        AnyGuard::Redis(g) => Some(g.grant_value().to_owned()),
        AnyGuard::Redlock(g) => g
            .owner()
            .rsplit_once(':')
            .map(|(_, scope)| format!("{handle}/{scope}")),
        AnyGuard::Memory(g) => g.fencing_token().map(|t| format!("{handle}/{}", t.get())),
        // A hold's field is its client's and scope's: one grant while any hold of it lives.
        AnyGuard::Redisson(g) => Some(g.field().to_owned()),
        AnyGuard::Postgres(g) => g.fencing_token().map(|t| format!("{handle}/{}", t.get())),
        AnyGuard::Mysql(g) => g.fencing_token().map(|t| format!("{handle}/{}", t.get())),
        AnyGuard::Zookeeper(g) => g.fencing_token().map(|t| format!("{handle}/{}", t.get())),
        AnyGuard::Etcd(g) => g.fencing_token().map(|t| format!("{handle}/{}", t.get())),
        other => panic!("no model for {other:?}"),
    }
}

pub(super) async fn reenter(g: &AnyGuard) -> Option<AnyGuard> {
    match g {
        AnyGuard::Redis(g) => g.reenter().await.ok().map(AnyGuard::Redis),
        AnyGuard::Redlock(g) => g.reenter().await.ok().map(AnyGuard::Redlock),
        AnyGuard::Memory(g) => g.reenter().await.ok().map(AnyGuard::Memory),
        AnyGuard::Redisson(g) => g.reenter().await.ok().map(AnyGuard::Redisson),
        AnyGuard::Postgres(g) => g.reenter().await.ok().map(AnyGuard::Postgres),
        AnyGuard::Mysql(g) => g.reenter().await.ok().map(AnyGuard::Mysql),
        AnyGuard::Zookeeper(g) => g.reenter().await.ok().map(AnyGuard::Zookeeper),
        AnyGuard::Etcd(g) => g.reenter().await.ok().map(AnyGuard::Etcd),
        other => panic!("no model for {other:?}"),
    }
}

pub(super) fn held_count(locks: &AnyLocks) -> usize {
    match locks {
        AnyLocks::Redis(c) => c.held_count(),
        AnyLocks::Redlock(r) => r.held_count(),
        AnyLocks::Memory(m) => m.held_count(),
        AnyLocks::Redisson(r) => r.held_count(),
        AnyLocks::Postgres(p) => p.held_count(),
        AnyLocks::Mysql(m) => m.held_count(),
        AnyLocks::Zookeeper(z) => z.held_count(),
        AnyLocks::Etcd(e) => e.held_count(),
        other => panic!("no model for {other:?}"),
    }
}

pub(super) fn options(rng: &mut fastrand::Rng, fixed_leases: bool) -> LockOptions {
    let lease = if fixed_leases && rng.bool() {
        Lease::Fixed(Duration::from_millis(rng.u64(30..300)))
    } else {
        Lease::Watchdog
    };
    let wait = if rng.u8(0..3) == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(rng.u64(1..60))
    };
    LockOptions::new().lease(lease).wait(wait)
}

/// `options` as they are or, half the time, for a fair lock: fair waiters stand in a
/// line beside the others (Redlock keeps none).
fn plain_or_fair(rng: &mut fastrand::Rng, locks: &AnyLocks, options: LockOptions) -> LockOptions {
    if !matches!(locks, AnyLocks::Redlock(_)) && rng.bool() {
        options.fair()
    } else {
        options
    }
}

/// One task's random walk for `run_for`.
async fn walk(
    locks: AnyLocks,
    fixed_leases: bool,
    scope: LockScope,
    held: Held,
    seed: u64,
    run_for: Duration,
) -> u64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let until = Instant::now() + run_for;
    let mut steps = 0;
    while Instant::now() < until {
        steps += 1;
        let name = NAMES[rng.usize(0..NAMES.len())];
        match rng.u8(0..10) {
            0..=2 => {
                let options = options(&mut rng, fixed_leases).scope(&scope);
                let options = plain_or_fair(&mut rng, &locks, options);
                if let Ok(g) = locks.acquire(name, options).await {
                    lock(&held).list.push(g);
                }
            }
            3 => {
                // An acquisition cancelled somewhere in its request.
                let cut = Duration::from_micros(rng.u64(0..3000));
                let options = options(&mut rng, fixed_leases).scope(&scope);
                let options = plain_or_fair(&mut rng, &locks, options);
                if let Ok(Ok(g)) = tokio::time::timeout(cut, locks.acquire(name, options)).await {
                    lock(&held).list.push(g);
                }
            }
            4 => {
                let g = lock(&held).take_any(&mut rng);
                if let Some(g) = g {
                    if let Some(again) = reenter(&g).await {
                        lock(&held).list.push(again);
                    }
                    lock(&held).list.push(g);
                }
            }
            5 => {
                let g = lock(&held).take_any(&mut rng);
                drop(g);
            }
            6 | 7 => {
                let g = lock(&held).take_any(&mut rng);
                if let Some(g) = g {
                    if rng.bool() {
                        let _ = g.release().await;
                    } else {
                        // A release cancelled mid-call.
                        let cut = Duration::from_micros(rng.u64(0..2000));
                        let _ = tokio::time::timeout(cut, g.release()).await;
                    }
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(rng.u64(0..8))).await,
        }
    }
    // Leave nothing held.
    let rest: Vec<AnyGuard> = lock(&held).list.drain(..).collect();
    for g in rest {
        let _ = g.release().await;
    }
    steps
}

/// One look at every guard alive; returns a description of any violation.
async fn check(
    server: &mut Option<Server>,
    keys: &[(String, String)],
    tasks: &[(usize, Held)],
) -> Option<String> {
    for (name, key) in keys {
        // Who believes they hold `name`, and until when.
        let t0 = Instant::now();
        // Each believer's grant, belief, description, task, and that task's count of
        // guards taken out at the look.
        let mut believers: Vec<(String, Instant, String, usize, u64)> = Vec::new();
        // Every task's guards at one instant: read one task at a time, a grant given
        // back after its task was read and taken by a later task would look like two.
        let all: Vec<_> = tasks.iter().map(|(h, held)| (*h, lock(held))).collect();
        for (task, (handle, guards)) in all.iter().enumerate() {
            for g in guards.list.iter().filter(|g| g.name() == name.as_str()) {
                let left = g.valid_for();
                if left > MARGIN
                    && let Some(grant) = grant(*handle, g)
                {
                    let what = format!("{g:?}");
                    believers.push((grant, t0 + left, what, task, guards.taken_out));
                }
            }
        }
        drop(all);
        let mut grants: Vec<&str> = believers.iter().map(|b| b.0.as_str()).collect();
        grants.sort_unstable();
        grants.dedup();
        if grants.len() > 1 {
            return Some(format!(
                "two grants of {name} both believe they hold it: {believers:?}"
            ));
        }
        let (Some(server), Some(grant)) = (server.as_mut(), grants.first()) else {
            continue;
        };
        let (holds, pttl) = server.shows(key, grant).await;
        let t1 = Instant::now();
        // The key ends no later than this (the PTTL was read before t1, in whole
        // milliseconds; -1: never), so a guard believing past it is wrong however
        // late the read was.
        let ends = u64::try_from(pttl)
            .ok()
            .map(|ms| t1 + Duration::from_millis(ms + 1));
        for (grant, until, what, task, taken_out) in &believers {
            // A guard taken out and released between the look and the read is no
            // violation: count only grants some guard still holds after the read (a
            // grant is given back only once its last guard is gone).
            if t1 + MARGIN >= *until || !still_held(tasks, grant) {
                continue;
            }
            // A Redisson field may have been given back and taken again by the same
            // scope around the read: only a guard whose task took none out since the
            // look (so the very guard is still held) counts.
            if server.redisson && lock(&tasks[*task].1).taken_out != *taken_out {
                continue;
            }
            if !holds {
                return Some(format!(
                    "{what} believes it holds {name} for {:?} more, the server shows \
                     another holder or none",
                    *until - t1
                ));
            }
            // Our values are unique per grant, so the key's expiry is this grant's lease
            // (a Redisson field is one scope's, and its next grant may lease less).
            if !server.redisson
                && let Some(ends) = ends.filter(|e| *e + MARGIN < *until)
            {
                return Some(format!(
                    "{what} believes it holds {name} for {:?} more, the server ends it \
                     {:?} sooner",
                    *until - t1,
                    *until - ends
                ));
            }
        }
    }
    None
}

/// Whether some guard alive now holds the grant `grant`.
fn still_held(tasks: &[(usize, Held)], grant: &str) -> bool {
    tasks.iter().any(|(handle, held)| {
        lock(held)
            .list
            .iter()
            .any(|g| self::grant(*handle, g).as_deref() == Some(grant) && g.valid_for() > MARGIN)
    })
}

async fn run_model(mut backend: Backend, seed: u64, run_for: Duration) {
    let keys: Vec<(String, String)> = NAMES
        .iter()
        .map(|n| {
            // The checker reads a grant back only on Redis, under the lock's key there.
            let key = match &backend.locks[0] {
                AnyLocks::Redis(c) => c.keys(*n).unwrap().key,
                // Redisson's layout keeps a lock at its bare name.
                _ => n.to_string(),
            };
            (n.to_string(), key)
        })
        .collect();
    // 3 scopes on the first handle shared by 2 tasks each, 3 scopes of one task on
    // the second.
    let mut plan = Vec::new();
    for _ in 0..3 {
        let scope = LockScope::new();
        plan.push((0, scope.clone()));
        plan.push((0, scope));
    }
    for _ in 0..3 {
        plan.push((1, LockScope::new()));
    }
    let tasks: Vec<(usize, Held)> = plan.iter().map(|(h, _)| (*h, Held::default())).collect();
    let walkers: Vec<_> = plan
        .into_iter()
        .zip(&tasks)
        .enumerate()
        .map(|(i, ((h, scope), (_, held)))| {
            tokio::spawn(walk(
                backend.locks[h].clone(),
                backend.fixed_leases,
                scope,
                held.clone(),
                seed.wrapping_mul(31).wrapping_add(i as u64),
                run_for,
            ))
        })
        .collect();
    let (steps, checks) = watch(walkers, seed, async || {
        check(&mut backend.server, &keys, &tasks).await
    })
    .await;
    println!("seed {seed}: {steps} steps, {checks} checks, no violation");
    assert!(steps > 500, "too few steps ({steps}) to mean anything");
    assert!(checks > 100, "too few checks ({checks})");
    for locks in &backend.locks {
        common::eventually(Duration::from_secs(5), "every grant given back", || async {
            held_count(locks) == 0
        })
        .await;
    }
}

/// Runs `check` every half millisecond until every walker has finished, and panics with
/// the seed on the first violation it answers; answers the walkers' counts summed and
/// how many checks ran.
pub(super) async fn watch(
    walkers: Vec<tokio::task::JoinHandle<u64>>,
    seed: u64,
    mut check: impl AsyncFnMut() -> Option<String>,
) -> (u64, u64) {
    let mut checks = 0u64;
    while walkers.iter().any(|w| !w.is_finished()) {
        if let Some(violation) = check().await {
            panic!("seed {seed}: {violation}");
        }
        checks += 1;
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let mut counted = 0;
    for w in walkers {
        counted += w.await.unwrap();
    }
    (counted, checks)
}

pub(super) fn seed() -> u64 {
    let seed = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("MODEL_SEED={seed}");
    seed
}

/// With batching (the default): concurrent acquisitions and releases share script calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(redis(true).await, seed(), Duration::from_secs(4)).await;
}

/// With every call its own command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_no_two_owners_without_batching() {
    run_model(redis(false).await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(cluster().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(redisson(false).await, seed(), Duration::from_secs(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_on_a_cluster_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(redisson(true).await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(redlock().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(memory(), seed(), Duration::from_secs(3)).await;
}

/// The checker can fail: two memory stores that do not share exclude nobody, and the
/// model must catch their grants of one name overlapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "both believe they hold it")]
async fn two_unrelated_stores_are_caught_overlapping() {
    let mut backend = memory();
    backend.locks[1] = memory().locks[1].clone();
    run_model(backend, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(postgres().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(mysql().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(zookeeper().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_no_two_owners_ever_believe_they_hold_one_name() {
    run_model(etcd().await, seed(), Duration::from_secs(3)).await;
}
