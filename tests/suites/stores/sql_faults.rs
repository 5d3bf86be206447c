//! Faults of the database stores on real servers the harness starts: a guard dropped
//! after its runtime ended, on a thread with none; a guard held on after its runtime
//! ended (reported lost, the database still excluding others); and acquisitions while
//! the server is unreachable (a cut proxy), which must end within their wait budget
//! plus one command timeout whatever the pool does; and releases while it is, whose
//! sessions are closed once it is back.

use crate::common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::runtime;
use lock_core::{AnyLocks, DistributedLock, HeldLock, LockConfig, LockOptions, PostgresLocks};
use lock_tests::{MariaDbServer, PostgresServer, TcpProxy};
use sqlx::postgres::PgPoolOptions;

const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// Scheduling and connection teardown on a loaded machine.
const SLACK: Duration = Duration::from_millis(1_500);

fn config() -> LockConfig {
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(800))
        .with_watchdog_period(Duration::from_millis(200))
        .with_command_timeout(COMMAND_TIMEOUT)
}

/// Takes `name` on a runtime that then ends, drops the guard on a thread with no
/// runtime (it must not panic), and expects a fresh client (`open`, on a new runtime)
/// to take `name` within 10 s.
fn dropped_without_a_runtime<L, F, Fut>(open: F)
where
    L: DistributedLock,
    L::Guard: Send + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = L>,
{
    let guard = taken_on_a_runtime_that_ends(&open, "dropped");
    let dropped = std::thread::spawn(move || drop(guard)).join();
    assert!(
        dropped.is_ok(),
        "dropping the guard outside a runtime panicked"
    );

    let freed = runtime().block_on(async { taken_within_10s(&open().await, "dropped").await });
    if let Err(last) = freed {
        panic!("the lock stayed held: {last}");
    }
}

/// A guard of `name` from a client `open` makes on a runtime that has ended since.
fn taken_on_a_runtime_that_ends<L, F, Fut>(open: &F, name: &str) -> L::Guard
where
    L: DistributedLock,
    F: Fn() -> Fut,
    Fut: Future<Output = L>,
{
    runtime().block_on(async { open().await.lock_named(name).await.unwrap() })
}

/// Whether `other` takes (and gives back) `name` within 10 s; the last error if not.
async fn taken_within_10s<L: DistributedLock>(other: &L, name: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = String::new();
    while Instant::now() < deadline {
        match other.try_lock_named(name).await {
            Ok(g) => return g.release().await.map(drop).map_err(|e| e.to_string()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(last)
}

async fn postgres(server: &PostgresServer) -> PostgresLocks {
    PostgresLocks::connect(&server.url(), config())
        .await
        .unwrap()
}

async fn mysql(server: &MariaDbServer) -> lock_core::MysqlLocks {
    lock_core::MysqlLocks::connect(&server.url(), config())
        .await
        .unwrap()
}

#[test]
fn a_postgres_guard_dropped_with_no_runtime_frees_the_lock() {
    let server = PostgresServer::start();
    dropped_without_a_runtime(|| postgres(&server));
}

#[test]
fn a_mysql_guard_dropped_with_no_runtime_frees_the_lock() {
    let server = MariaDbServer::start();
    dropped_without_a_runtime(|| mysql(&server));
}

/// With the proxy to the server cut, a wait of 1 s and a try each end in an
/// unavailable error within their budget plus one command timeout (and slack).
async fn unreachable_ends_within_budget<L: DistributedLock>(locks: &L, proxy: &TcpProxy) {
    // The pool keeps a connection, and first-use setup is done.
    locks
        .lock_named("warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.cut();
    for wait in [Duration::from_secs(1), Duration::ZERO] {
        let started = Instant::now();
        let taken = tokio::time::timeout(
            Duration::from_secs(45),
            locks.acquire("x", LockOptions::new().wait(wait)),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer within 45 s (wait {wait:?})"));
        let took = started.elapsed();
        let err = taken.map(drop).unwrap_err();
        assert!(err.is_unavailable(), "wait {wait:?}: {err}");
        assert!(
            took <= wait + COMMAND_TIMEOUT + SLACK,
            "wait {wait:?}: took {took:?}: {err}"
        );
    }
}

/// A proxy in front of `server`, and locks on a pool through it (the pool's own 30 s
/// wait for a connection left as sqlx sets it).
async fn postgres_through_proxy(server: &PostgresServer) -> (TcpProxy, PostgresLocks) {
    let proxy = TcpProxy::start(server.port());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let pool = PgPoolOptions::new().connect(&url).await.unwrap();
    (proxy, PostgresLocks::new(pool, config()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_acquisition_ends_within_its_budget_with_the_server_unreachable() {
    let server = PostgresServer::start();
    let (proxy, locks) = postgres_through_proxy(&server).await;
    unreachable_ends_within_budget(&locks, &proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_acquisition_through_any_locks_ends_within_its_budget_when_unreachable() {
    let server = MariaDbServer::start();
    let proxy = TcpProxy::start(server.port());
    let url = format!("mariadb://root@127.0.0.1:{}/locks", proxy.port());
    let locks = AnyLocks::open(&url, config()).await.unwrap();
    unreachable_ends_within_budget(&locks, &proxy).await;
}

/// Takes a lock on a runtime that then ends and holds the guard on. Its session's
/// connection belonged to that runtime, so the watchdog can no longer check it: the
/// guard reports the lock lost, while the database keeps it (the connection is still
/// open) and no other client takes it, until the guard is dropped.
fn held_after_its_runtime_ended<L, F, Fut>(open: F)
where
    L: DistributedLock,
    L::Guard: Send + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = L>,
{
    let guard = taken_on_a_runtime_that_ends(&open, "held-on");
    let rt = runtime();
    rt.block_on(async {
        let fired = tokio::time::timeout(Duration::from_secs(3), guard.lost()).await;
        assert!(
            fired.is_ok(),
            "a session nobody can check was not reported lost"
        );
        assert!(!guard.is_held());
        let other = open().await;
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let taken = other.try_lock_named("held-on").await;
            assert!(
                taken.is_err(),
                "another client took a lock the database still holds"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let freed = rt.block_on(async { taken_within_10s(&open().await, "held-on").await });
    if let Err(last) = freed {
        panic!("the lock stayed held: {last}");
    }
}

#[test]
fn a_postgres_guard_held_after_its_runtime_ended_is_lost_and_still_excludes() {
    let server = PostgresServer::start();
    held_after_its_runtime_ended(|| postgres(&server));
}

#[test]
fn a_mysql_guard_held_after_its_runtime_ended_is_lost_and_still_excludes() {
    let server = MariaDbServer::start();
    held_after_its_runtime_ended(|| mysql(&server));
}

/// A release while the server is unreachable (a cut proxy) ends within one command
/// timeout with an error, instead of waiting on a silent connection for as long as
/// TCP takes to give up. Its session is closed, so once the server sees that, the lock
/// is free for `other`, which reaches the server directly.
async fn release_ends_within_timeout_when_unreachable<L, M>(locks: &L, other: &M, proxy: &TcpProxy)
where
    L: DistributedLock,
    M: DistributedLock,
{
    let g = locks.lock_named("held").await.unwrap();
    proxy.cut();
    let started = Instant::now();
    let released = tokio::time::timeout(Duration::from_secs(45), g.release())
        .await
        .expect("no answer within 45 s");
    let took = started.elapsed();
    let err = released.map(drop).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(took <= COMMAND_TIMEOUT + SLACK, "took {took:?}: {err}");
    proxy.heal();
    let g = other
        .acquire("held", LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the lock of the closed session was freed");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_release_ends_within_the_command_timeout_with_the_server_unreachable() {
    let server = PostgresServer::start();
    let (proxy, cut) = postgres_through_proxy(&server).await;
    let direct = AnyLocks::open(&server.url(), config()).await.unwrap();
    release_ends_within_timeout_when_unreachable(&cut, &direct, &proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_release_ends_within_the_command_timeout_with_the_server_unreachable() {
    let server = MariaDbServer::start();
    let proxy = TcpProxy::start(server.port());
    let url = format!("mariadb://root@127.0.0.1:{}/locks", proxy.port());
    let cut = AnyLocks::open(&url, config()).await.unwrap();
    let direct = AnyLocks::open(&server.url(), config()).await.unwrap();
    release_ends_within_timeout_when_unreachable(&cut, &direct, &proxy).await;
}

/// A release cut short while a session check waits on the unreachable server (a check
/// may wait as long as the lease it proves, longer than a release's command timeout):
/// once the server is back, the session is closed and the lock freed, even while
/// something (a `lost()` future kept past the release) still holds the grant.
async fn released_during_a_stuck_check_is_freed<L, M>(locks: &L, other: &M, proxy: &TcpProxy)
where
    L: DistributedLock,
    M: DistributedLock,
{
    let g = locks.lock_named("held").await.unwrap();
    let kept = tokio::spawn(g.lost());
    proxy.cut();
    // The scenario is time: past one watchdog period, a check waits on the cut proxy.
    tokio::time::sleep(STUCK_CHECK.1 * 3 / 2).await;
    let err = g.release().await.map(drop).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    proxy.heal();
    let g = other
        .acquire("held", LockOptions::new().wait(Duration::from_secs(15)))
        .await
        .expect("the released lock was freed");
    g.release().await.unwrap();
    assert!(!kept.is_finished(), "a released lock is not lost");
    kept.abort();
}

/// Lease and period: a check's time limit (the lease left) well past the command
/// timeout.
const STUCK_CHECK: (Duration, Duration) = (Duration::from_secs(6), Duration::from_secs(1));

fn stuck_check_config() -> LockConfig {
    config()
        .with_watchdog_lease(STUCK_CHECK.0)
        .with_watchdog_period(STUCK_CHECK.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_release_during_a_stuck_check_frees_the_lock_once_reachable() {
    let server = PostgresServer::start();
    let proxy = TcpProxy::start(server.port());
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
    let cut = AnyLocks::open(&url, stuck_check_config()).await.unwrap();
    let direct = AnyLocks::open(&server.url(), config()).await.unwrap();
    released_during_a_stuck_check_is_freed(&cut, &direct, &proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_release_during_a_stuck_check_frees_the_lock_once_reachable() {
    let server = MariaDbServer::start();
    let proxy = TcpProxy::start(server.port());
    let url = format!("mariadb://root@127.0.0.1:{}/locks", proxy.port());
    let cut = AnyLocks::open(&url, stuck_check_config()).await.unwrap();
    let direct = AnyLocks::open(&server.url(), config()).await.unwrap();
    released_during_a_stuck_check_is_freed(&cut, &direct, &proxy).await;
}
