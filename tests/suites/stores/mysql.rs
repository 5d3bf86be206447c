//! The MySQL store on a real MariaDB server the harness starts: exclusion across
//! pools, waiting in the server, reentrancy, long names, names differing in case or
//! spelling a hashed name, a killed connection firing `lost()`, cancellation, a wait
//! that fails with its server.

use crate::checks;

use std::time::{Duration, Instant};

use lock_core::{LockConfig, LockOptions, LockScope, MysqlLocks, Released};
use lock_tests::MariaDbServer;
use sqlx::mysql::MySqlPoolOptions;

fn config() -> LockConfig {
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(800))
        .with_watchdog_period(Duration::from_millis(200))
        .with_wait(Duration::from_secs(10))
}

async fn locks(server: &MariaDbServer) -> MysqlLocks {
    let pool = MySqlPoolOptions::new()
        .max_connections(20)
        .connect(&server.url())
        .await
        .expect("connect to the test mariadb");
    MysqlLocks::new(pool, config()).unwrap()
}

/// Who holds `name` on the server (its connection id), if anyone.
async fn holder(locks: &MysqlLocks, name: &str) -> Option<i64> {
    sqlx::query_scalar("SELECT IS_USED_LOCK(?)")
        .bind(name)
        .fetch_one(locks.pool())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pools_never_hold_one_name_at_once_and_tokens_grow() {
    let server = MariaDbServer::start();
    let stores = [locks(&server).await, locks(&server).await];
    checks::never_two_holders_and_tokens_grow(&stores, 16).await;
    assert_eq!(stores[0].held_count() + stores[1].held_count(), 0);
    let name = stores[0].server_name("counter").unwrap();
    assert_eq!(holder(&stores[0], &name).await, None, "nothing left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_wait_in_the_server_and_timeout() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    checks::busy_then_timeout_then_woken(&a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_per_scope_and_long_names_hashed() {
    let server = MariaDbServer::start();
    let locks = locks(&server).await;
    let scope = LockScope::new();
    let long = "n".repeat(300);
    let outer = locks
        .acquire(long.as_str(), LockOptions::new().scope(&scope))
        .await
        .unwrap();
    let inner = locks
        .acquire(long.as_str(), LockOptions::new().scope(&scope))
        .await
        .unwrap();
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert!(locks.try_lock(long.as_str()).await.unwrap_err().is_busy());
    let sent = locks.server_name(long.as_str()).unwrap();
    assert!(sent.len() <= 64, "{sent}");
    assert!(holder(&locks, &sent).await.is_some(), "held under {sent}");
    assert_eq!(
        inner.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    );
    drop(outer);
    let again = locks
        .acquire(long.as_str(), LockOptions::new().scope(&scope))
        .await
        .unwrap();
    assert!(locks.try_lock(long.as_str()).await.unwrap_err().is_busy());
    assert_eq!(again.release().await.unwrap(), Released::Unlocked);
    assert!(locks.try_lock(long.as_str()).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_fires_lost_and_lets_another_owner_in() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let g = a.lock("job").await.unwrap();
    let name = a.server_name("job").unwrap();
    let id = holder(&b, &name).await.expect("held");
    sqlx::query(&format!("KILL {id}"))
        .execute(b.pool())
        .await
        .unwrap();
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
async fn a_cancelled_wait_leaves_no_lock_behind() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    // A cancelled wait closes its session: none of them holds or later takes the lock.
    checks::cancelled_waits_leave_no_lock(&a, &b).await;
    assert_eq!(b.held_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_differing_only_in_case_are_two_locks() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let upper = a.lock("Order").await.unwrap();
    let lower = b.try_lock("order").await.unwrap();
    let (sent_upper, sent_lower) = (
        a.server_name("Order").unwrap(),
        a.server_name("order").unwrap(),
    );
    let (by_a, by_b) = (holder(&a, &sent_upper).await, holder(&a, &sent_lower).await);
    assert!(
        by_a.is_some() && by_b.is_some() && by_a != by_b,
        "{by_a:?} {by_b:?}"
    );
    lower.release().await.unwrap();
    upper.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_name_spelling_a_long_names_hashed_form_is_another_lock() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let long = "n".repeat(300);
    let hashed = a.server_name(long.as_str()).unwrap();
    let forged = hashed.strip_prefix("lock:").expect("the default namespace");
    let held = a.lock(long.as_str()).await.unwrap();
    let other = b.try_lock(forged).await.unwrap();
    assert_ne!(b.server_name(forged).unwrap(), hashed);
    other.release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_leases_do_not_apply_and_hold_until_expiry_gives_back() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let past = a.config().watchdog_lease() * 2;
    checks::session_locks_ignore_leases_and_give_back_on_expiry(&a, &b, past).await;
}

/// A wait meant as "never" (`Duration::MAX`, which Redis and memory take) makes a
/// store that works: the pool's wait for a connection is bounded, not overflowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_meant_as_never_makes_a_working_store() {
    let server = MariaDbServer::start();
    let locks = MysqlLocks::connect(&server.url(), config().with_wait(Duration::MAX))
        .await
        .unwrap();
    let held = locks.try_lock("never").await.unwrap();
    held.release().await.unwrap();
}

/// A config that `LockConfig::validate` refuses makes no store, as on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_validate_refuses_makes_no_store() {
    let server = MariaDbServer::start();
    let never = config().with_command_timeout(Duration::MAX);
    let pool = MySqlPoolOptions::new()
        .connect(&server.url())
        .await
        .unwrap();
    let e = MysqlLocks::new(pool, never.clone()).unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidConfig(_)), "{e:?}");
    let e = MysqlLocks::connect(&server.url(), never).await.unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidConfig(_)), "{e:?}");
}

/// The application's own `max_statement_time` (MariaDB) on the pool's sessions does not
/// cut a wait short: the acquisition waits its budget and gets the lock when it is
/// freed, and the session keeps its setting for the application's own statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_max_statement_time_does_not_cut_a_wait_short() {
    let server = MariaDbServer::start();
    let holder = locks(&server).await;
    let pool = MySqlPoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query("SET max_statement_time = 0.3")
                    .execute(conn)
                    .await?;
                Ok(())
            })
        })
        .connect(&server.url())
        .await
        .unwrap();
    let waiter = MysqlLocks::new(pool.clone(), config()).unwrap();
    checks::a_wait_lasts_its_budget(&holder, &waiter).await;
    let setting: f64 = sqlx::query_scalar("SELECT @@max_statement_time")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(setting, 0.3);
}

/// An acquisition waiting in the server, dropped on a thread with no runtime (its own
/// runtime still running), neither panics nor leaves its session holding the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquisition_dropped_outside_any_runtime_does_not_panic() {
    let server = MariaDbServer::start();
    let holder = locks(&server).await;
    let waiter = locks(&server).await;
    let g = holder.lock("x").await.unwrap();
    let mut waiting = Box::pin({
        let waiter = waiter.clone();
        async move {
            waiter
                .acquire("x", LockOptions::new().wait(Duration::from_secs(30)))
                .await
        }
    });
    // Long enough to have its session and be waiting in `GET_LOCK`.
    let polled = tokio::time::timeout(Duration::from_millis(500), &mut waiting).await;
    assert!(polled.is_err(), "the lock was free: {polled:?}");
    let dropped = std::thread::spawn(move || drop(waiting)).join();
    assert!(
        dropped.is_ok(),
        "dropping the acquisition outside a runtime panicked"
    );
    g.release().await.unwrap();
    // The dropped waiter's session was closed, not left holding the lock.
    let again = holder
        .acquire("x", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("the dropped waiter's session kept the lock");
    again.release().await.unwrap();
}

/// A cancelled wait's session stops waiting in `GET_LOCK` once its acquisition is
/// cancelled, not when the wait's own timeout runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waits_session_leaves_the_queue() {
    let server = MariaDbServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    checks::a_cancelled_wait_leaves_the_servers_queue(&a, b, || async {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE '%GET_LOCK(%' AND ID <> CONNECTION_ID()",
        )
        .fetch_one(a.pool())
        .await
        .unwrap()
    })
    .await;
}

/// A wait that fails with its server (a restart) ends no session: its own died with the
/// server, whose next life counts ids from 1 again, so a `KILL` of the old id would end
/// another client's session, one that may hold a lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_fails_with_its_server_ends_no_session_of_its_next_life() {
    use sqlx::Connection;
    let mut server = MariaDbServer::start();
    let a = locks(&server).await;
    // The waiter reaches the server through a proxy, held while the server restarts, so
    // that the next life's first sessions are the others below.
    let proxy = lock_tests::TcpProxy::start(server.port());
    let url = format!("mariadb://root@127.0.0.1:{}/locks", proxy.port());
    let slow = config().with_command_timeout(Duration::from_secs(20));
    let b = MysqlLocks::connect(&url, slow).await.unwrap();
    let _held = a.lock("x").await.unwrap();
    let waiter = tokio::spawn(async move {
        b.acquire("x", LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .map(drop)
    });
    crate::common::eventually(
        Duration::from_secs(10),
        "the waiter in GET_LOCK",
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '%GET_LOCK(%' \
             AND ID <> CONNECTION_ID()",
            )
            .fetch_one(a.pool())
            .await
            .unwrap();
            waiting == 1
        },
    )
    .await;
    proxy.cut();
    tokio::task::block_in_place(|| server.restart());
    // The next life's first sessions, each holding a lock of its own.
    let mut others = Vec::new();
    for i in 0..20 {
        let mut c = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
        let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
            .bind(format!("v{i}"))
            .fetch_one(&mut c)
            .await
            .unwrap();
        assert_eq!(got, Some(1));
        others.push(c);
    }
    proxy.heal();
    let waited = waiter.await.unwrap();
    assert!(waited.is_err(), "the wait failed with its server");
    // The scenario is time: a stop sent after the failure lands within moments.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (i, c) in others.iter_mut().enumerate() {
        let mine: Option<i64> = sqlx::query_scalar("SELECT IS_USED_LOCK(?) = CONNECTION_ID()")
            .bind(format!("v{i}"))
            .fetch_one(&mut *c)
            .await
            .unwrap_or_else(|e| panic!("session {i} of the next life was ended: {e}"));
        assert_eq!(mine, Some(1), "session {i} lost its lock");
    }
}

/// A server whose sessions start with `autocommit = 0` (set globally, or by a shared
/// pool's `after_connect`): the fencing counter's row is updated in a transaction that
/// nobody would commit, locking that row for as long as the connection lives. Locks of
/// other names must still be granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_autocommit_grants_other_names_beside_a_held_one() {
    let server = MariaDbServer::start_with_args(&["--autocommit=0"]);
    let (a, b) = (locks(&server).await, locks(&server).await);
    let held = a.lock("a").await.unwrap();
    let other = tokio::time::timeout(
        Duration::from_secs(20),
        b.acquire("b", LockOptions::new().wait(Duration::from_secs(5))),
    )
    .await
    .expect("no answer within 20 s")
    .expect("another name is granted beside a held one");
    assert!(other.fencing_token().unwrap() > held.fencing_token().unwrap());
    other.release().await.unwrap();
    held.release().await.unwrap();
    // And again, on the connections those holds went back to the pool with.
    let again = b.lock("c").await.unwrap();
    let beside = a.lock("d").await.unwrap();
    again.release().await.unwrap();
    beside.release().await.unwrap();
}
