//! The PostgreSQL store on a real PostgreSQL server the harness starts: exclusion
//! across pools, waiting in the server, reentrancy, a killed session firing `lost()`,
//! the session check asking about its own backend, cancellation (of a wait, and of a
//! release waiting for its session).

use crate::checks;

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use lock_core::{LockConfig, LockOptions, LockScope, PostgresLocks, Released};
use lock_tests::PostgresServer;
use sqlx::Connection;
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
    PostgresLocks::new(pool, config()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_never_hold_one_name_at_once_and_tokens_grow() {
    let server = PostgresServer::start();
    let stores = [locks(&server).await, locks(&server).await];
    checks::never_two_holders_and_tokens_grow(&stores, 16).await;
    assert_eq!(stores[0].held_count() + stores[1].held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_wait_in_the_server_and_timeout() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    checks::busy_then_timeout_then_woken(&a, b).await;
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
    let fired = checks::loss_lets_another_owner_in(
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
    checks::cancelled_waits_leave_no_lock(&a, &b).await;
    assert_eq!(b.held_count(), 0);
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
    )
    .fetch_one(a.pool())
    .await
    .unwrap();
    assert_eq!(waiting, 0, "no cancelled waiter left queued in the server");
}

/// A cancelled wait's backend stops waiting once its connection is closed
/// (`client_connection_check_interval`), not when its `lock_timeout` runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waits_backend_leaves_the_queue() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    checks::a_cancelled_wait_leaves_the_servers_queue(&a, b, || async {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(a.pool())
        .await
        .unwrap()
    })
    .await;
}

/// The backend holding the advisory lock `key`, if any.
async fn holder(locks: &PostgresLocks, key: i64) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND ((classid::bigint << 32) | objid::bigint) = $1",
    )
    .bind(key)
    .fetch_optional(locks.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_check_finds_its_lock_whatever_the_key_bits() {
    let server = PostgresServer::start();
    let locks = locks(&server).await;
    // A negative key whose low half has its top bit set: both halves need the
    // unsigned (oid) reading of pg_locks to be found.
    let name = (0..)
        .map(|i| format!("bits-{i}"))
        .find(|n| {
            let key = locks.advisory_key(n.as_str()).unwrap();
            key < 0 && (key as u32) >= 1 << 31
        })
        .unwrap();
    let g = locks.lock(name.as_str()).await.unwrap();
    // Three good checks in a row: each one pushes valid_for back up.
    let (mut renewals, mut last) = (0, g.valid_for());
    let deadline = Instant::now() + Duration::from_secs(10);
    while renewals < 3 {
        assert!(
            Instant::now() < deadline,
            "only {renewals} checks passed in 10 s"
        );
        assert!(
            g.is_held(),
            "the check did not find the lock its session holds"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = g.valid_for();
        if now > last {
            renewals += 1;
        }
        last = now;
    }
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
}

/// A release polled while the session check holds the guard's connection (the check
/// is stuck behind a lock on `pg_locks`), then dropped: the session must be closed,
/// not pooled while it still holds the advisory lock.
#[tokio::test]
async fn a_release_cancelled_while_waiting_for_its_session_leaves_no_lock_held() {
    let server = PostgresServer::start();
    let other = locks(&server).await;
    // A long lease: the stuck check must not end in a loss before the release runs.
    let pool = PgPoolOptions::new().connect(&server.url()).await.unwrap();
    let store =
        PostgresLocks::new(pool, config().with_watchdog_lease(Duration::from_secs(10))).unwrap();
    let g = store.lock("cut-release").await.unwrap();
    let key = store.advisory_key("cut-release").unwrap();
    let pid = holder(&other, key).await.expect("held");

    let mut blocker = other.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE pg_catalog.pg_locks IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: Option<String> =
            sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_one(other.pool())
                .await
                .unwrap();
        if waiting.as_deref() == Some("Lock") {
            break;
        }
        assert!(Instant::now() < deadline, "the session check never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // On this one-thread runtime the check still holds the connection when the
    // release is first polled, so the release is cut while it waits for it.
    assert!(
        g.release().now_or_never().is_none(),
        "the release did not wait"
    );
    blocker.rollback().await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let err = match other.try_lock("cut-release").await {
            Ok(g) => {
                assert_eq!(g.release().await.unwrap(), Released::Unlocked);
                break;
            }
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            let pid = holder(&other, key).await;
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_optional(other.pool())
                    .await
                    .unwrap()
                    .flatten();
            panic!("still held by backend {pid:?} (state {state:?}): {err}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(holder(&other, key).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_leases_do_not_apply_and_hold_until_expiry_gives_back() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let past = a.config().watchdog_lease() * 2;
    checks::session_locks_ignore_leases_and_give_back_on_expiry(&a, &b, past).await;
}

/// A wait budget past what `lock_timeout` holds (2^31 - 1 ms, about 24.8 days) waits in
/// the server as long as the setting allows, instead of failing every acquisition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_budget_of_a_month_is_waited_in_the_server() {
    let server = PostgresServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let month = LockOptions::new().wait(Duration::from_secs(30 * 86_400));
    let held = a.acquire("long", month.clone()).await.unwrap();
    let waiter = tokio::spawn(async move { b.acquire("long", month).await.map(drop) });
    // The waiter's request for the lock is queued in the server.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
        )
        .fetch_one(a.pool())
        .await
        .unwrap();
        if waiting == 1 {
            break;
        }
        assert!(
            !waiter.is_finished(),
            "the waiter did not wait: {:?}",
            waiter.await
        );
        assert!(Instant::now() < deadline, "the waiter never queued");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was granted once the lock was free")
        .unwrap()
        .unwrap();
}

/// A wait meant as "never" (`Duration::MAX`, which Redis and memory take) makes a
/// store that works: the pool's wait for a connection is bounded, not overflowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_meant_as_never_makes_a_working_store() {
    let server = PostgresServer::start();
    let locks = PostgresLocks::connect(&server.url(), config().with_wait(Duration::MAX))
        .await
        .unwrap();
    let held = locks.try_lock("never").await.unwrap();
    held.release().await.unwrap();
}

/// A config that `LockConfig::validate` refuses (here a command timeout meant as
/// "never", which deadline sums would overflow) makes no store, as on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_validate_refuses_makes_no_store() {
    let server = PostgresServer::start();
    let never = config().with_command_timeout(Duration::MAX);
    let pool = PgPoolOptions::new().connect(&server.url()).await.unwrap();
    let e = PostgresLocks::new(pool, never.clone()).unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidConfig(_)), "{e:?}");
    let e = PostgresLocks::connect(&server.url(), never)
        .await
        .unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidConfig(_)), "{e:?}");
}

/// A pool whose sessions start with `setting` (`SET ...`), at most `max` of them.
async fn pool_with(server: &PostgresServer, setting: &'static str, max: u32) -> sqlx::PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .after_connect(move |conn, _| {
            Box::pin(async move {
                sqlx::query(setting).execute(conn).await?;
                Ok(())
            })
        })
        .connect(&server.url())
        .await
        .unwrap()
}

/// The application's own `statement_timeout` on the pool's sessions does not cut a
/// wait short: the acquisition waits its budget and gets the lock when it is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_statement_timeout_does_not_cut_a_wait_short() {
    let server = PostgresServer::start();
    let holder = locks(&server).await;
    let pool = pool_with(&server, "SET statement_timeout = '300ms'", 4).await;
    let waiter = PostgresLocks::new(pool, config()).unwrap();
    checks::a_wait_lasts_its_budget(&holder, &waiter).await;
}

/// A waiting acquisition leaves the session's own `lock_timeout` as the application
/// set it, for the application's next query on that pooled session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_leaves_the_sessions_own_lock_timeout() {
    let server = PostgresServer::start();
    let pool = pool_with(&server, "SET lock_timeout = '1234ms'", 1).await;
    let locks = PostgresLocks::new(pool.clone(), config()).unwrap();
    let g = locks
        .acquire("free", LockOptions::new().wait(Duration::from_secs(1)))
        .await
        .unwrap();
    g.release().await.unwrap();
    let timeout: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(timeout, "1234ms");
}

/// The wait runs out after the advisory lock was taken, while the statement waits for
/// the fencing sequence (DDL holds it): the session gives that lock back before it is
/// pooled again, instead of keeping the name locked from an idle session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_before_its_wait_ran_out_is_given_back() {
    let server = PostgresServer::start();
    let a = locks(&server).await;
    a.lock("warm").await.unwrap().release().await.unwrap();
    let mut blocker = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql(&format!(
        "BEGIN; ALTER SEQUENCE {} INCREMENT BY 1",
        lock_core::POSTGRES_FENCE_SEQUENCE
    ))
    .execute(&mut blocker)
    .await
    .unwrap();
    let missed = a
        .acquire("x", LockOptions::new().wait(Duration::from_millis(500)))
        .await
        .map(drop)
        .unwrap_err();
    assert!(missed.is_busy() || missed.is_timeout(), "{missed:?}");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    let other = locks(&server).await;
    let g = other
        .try_lock("x")
        .await
        .expect("an idle pooled session kept the lock");
    g.release().await.unwrap();
}
