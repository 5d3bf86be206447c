//! The PostgreSQL store on a real PostgreSQL server the harness starts: exclusion
//! across pools, waiting in the server, reentrancy, a killed session firing `lost()`,
//! cancellation.

#[path = "common/stores.rs"]
mod store_checks;

use std::time::{Duration, Instant};

use lock_core::{LockConfig, LockOptions, LockScope, PostgresLocks, Released};
use lock_tests::PostgresServer;
use sqlx::postgres::PgPoolOptions;

fn config() -> LockConfig {
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(800))
        .with_watchdog_period(Duration::from_millis(200))
        .with_wait(Duration::from_secs(10))
}

async fn locks(server: &PostgresServer) -> PostgresLocks {
    let pool = PgPoolOptions::new()
        .max_connections(20)
        .connect(&server.url())
        .await
        .expect("connect to the test postgres");
    PostgresLocks::new(pool, config())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_never_hold_one_name_at_once_and_tokens_grow() {
    let server = PostgresServer::start();
    let stores = [locks(&server).await, locks(&server).await];
    store_checks::never_two_holders_and_tokens_grow(&stores, 16).await;
    assert_eq!(stores[0].held_count() + stores[1].held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_wait_in_the_server_and_timeout() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    store_checks::busy_then_timeout_then_woken(&a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_per_scope_and_visible_in_pg_locks() {
    let server = PostgresServer::start();
    let locks = locks(&server).await;
    let scope = LockScope::new();
    let outer = locks
        .acquire("report", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    let inner = locks
        .acquire("report", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    let other = locks.try_lock("report").await.unwrap_err();
    assert!(other.is_busy(), "{other}");
    let key = locks.advisory_key("report").unwrap();
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
         AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(key)
    .fetch_one(locks.pool())
    .await
    .unwrap();
    assert_eq!(held, 1, "one session lock for two holds");
    assert_eq!(
        inner.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    );
    // Drop the last hold and take it again at once in the scope: nobody else gets in.
    drop(outer);
    let again = locks
        .acquire("report", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    assert!(locks.try_lock("report").await.unwrap_err().is_busy());
    assert_eq!(again.release().await.unwrap(), Released::Unlocked);
    assert!(locks.try_lock("report").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_session_fires_lost_and_lets_another_owner_in() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let g = a.lock("job").await.unwrap();
    let key = a.advisory_key("job").unwrap();
    let killed: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
         AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(key)
    .fetch_one(b.pool())
    .await
    .unwrap();
    assert!(killed);
    let killed_at = Instant::now();
    let fired = store_checks::loss_lets_another_owner_in(
        g,
        &b,
        "job",
        killed_at,
        "lost() fired within the check period and lease",
    )
    .await;
    assert!(fired < Duration::from_millis(1_000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_leaves_no_lock_and_no_connection_behind() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    // A cancelled wait closes its session: none of them holds or later takes the lock.
    store_checks::cancelled_waits_leave_no_lock(&a, &b).await;
    assert_eq!(b.held_count(), 0);
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    )
    .fetch_one(a.pool())
    .await
    .unwrap();
    assert_eq!(waiting, 0, "no cancelled waiter left queued in the server");
}
