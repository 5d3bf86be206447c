//! The ZooKeeper store on a real ZooKeeper server the harness starts: exclusion across
//! sessions, Curator's node layout (a contender made as Curator makes one excludes us
//! and is waited for), predecessor watching, a deleted node and a lost connection
//! firing `lost()`, cancellation; contender nodes removed despite lost connections
//! and replies ([`faults`]).

use crate::checks;
// Leader election through the faults that gave Curator's LeaderLatch two leaders.
mod election;
// Connection faults in their own file: they need long sessions and pauses.
mod faults;
// Read-write locks in Curator's layout.
mod read_write;

use std::time::{Duration, Instant};

use lock_core::zookeeper_client as zk;
use lock_core::{LockConfig, LockOptions, LockScope, Released, ZkLocks};
use lock_tests::ZooKeeperServer;

fn config() -> LockConfig {
    // The session timeout: a lost connection is noticed, and suspends the lock for a
    // third of it.
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(1_500))
        .with_wait(Duration::from_secs(10))
}

async fn locks(server: &ZooKeeperServer) -> ZkLocks {
    ZkLocks::connect(&server.connect_string(), config())
        .await
        .expect("connect to the test zookeeper")
}

async fn raw(server: &ZooKeeperServer) -> zk::Client {
    zk::Client::connect(&server.connect_string()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_never_hold_one_name_at_once_and_tokens_grow() {
    let server = ZooKeeperServer::start();
    let stores = [locks(&server).await, locks(&server).await];
    checks::never_two_holders_and_tokens_grow(&stores, 8).await;
    let dir = stores[0].lock_path("counter").unwrap();
    let left = raw(&server).await.list_children(&dir).await.unwrap();
    assert!(left.is_empty(), "contender nodes left behind: {left:?}");
}

/// A config that `LockConfig::validate` refuses makes no store, as on Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_that_validate_refuses_makes_no_store() {
    let server = ZooKeeperServer::start();
    let never = config().with_command_timeout(Duration::MAX);
    let e = ZkLocks::connect(&server.connect_string(), never.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidConfig(_)), "{e:?}");
    let e = ZkLocks::new(raw(&server).await, never).unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidConfig(_)), "{e:?}");
}

/// Names with characters outside the Basic Multilingual Plane (which ZooKeeper, reading
/// paths as UTF-16, refuses as surrogates) lock like any other: each is its own lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_beyond_the_basic_plane_is_a_lock_of_its_own() {
    let server = ZooKeeperServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let g = a.try_lock("order-\u{1f600}").await.unwrap();
    assert!(b.try_lock("order-\u{1f600}").await.unwrap_err().is_busy());
    let other = b.try_lock("order-\u{1f601}").await.unwrap();
    let path = a.lock_path("order-\u{1f600}").unwrap();
    assert!(path.ends_with("order-%F0%9F%98%80"), "{path}");
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    assert_eq!(other.release().await.unwrap(), Released::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_chroot_is_a_configuration_error_at_connect() {
    let server = ZooKeeperServer::start();
    let url = format!("{}/locks-root", server.connect_string());
    match ZkLocks::connect(&url, config()).await {
        Err(lock_core::LockError::InvalidConfig(why)) => {
            assert!(why.contains("/locks-root does not exist"), "{why}")
        }
        other => panic!("expected InvalidConfig, got {:?}", other.map(|_| ())),
    }
    let _ = raw(&server)
        .await
        .create(
            "/locks-root",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let locks = ZkLocks::connect(&url, config()).await.unwrap();
    let held = locks.try_lock("report").await.unwrap();
    assert_eq!(held.release().await.unwrap(), Released::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_style_contender_excludes_us_and_is_waited_for() {
    let server = ZooKeeperServer::start();
    let locks = locks(&server).await;
    let dir = locks.lock_path(("order", 7_u64)).unwrap();
    // What Curator's InterProcessMutex creates for a Java holder.
    let java = raw(&server).await;
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    java.mkdir(&dir, &persistent).await.unwrap();
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{dir}/_c_0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9-lock-");
    let (_, seq) = java.create(&prefix, b"10.0.0.9", &ephemeral).await.unwrap();
    let java_node = format!("{prefix}{seq}");

    let err = locks.try_lock(("order", 7_u64)).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock(("order", 7_u64)).await })
    };
    // The waiter queued its own node behind the Java one, in Curator's naming.
    let deadline = Instant::now() + Duration::from_secs(5);
    let ours = loop {
        let children = java.list_children(&dir).await.unwrap();
        if let Some(c) = children.iter().find(|c| !java_node.ends_with(c.as_str())) {
            break c.clone();
        }
        assert!(Instant::now() < deadline, "no contender node of ours");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(
        ours.starts_with("_c_") && ours.len() == 3 + 36 + 6 + 10,
        "{ours}"
    );
    assert!(
        !waiter.is_finished(),
        "granted while the Java holder holds it"
    );
    java.delete(&java_node, None).await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the predecessor's deletion")
        .unwrap()
        .unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
    assert!(java.list_children(&dir).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_reentrancy_and_a_cancelled_wait_leave_no_node() {
    let server = ZooKeeperServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let scope = LockScope::new();
    let held = a
        .acquire("x", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    let again = a
        .acquire("x", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    assert_eq!(held.fencing_token(), again.fencing_token());
    let started = Instant::now();
    let err = b
        .acquire("x", LockOptions::new().wait(Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    for _ in 0..3 {
        let cut = tokio::time::timeout(Duration::from_millis(50), b.lock("x")).await;
        assert!(cut.is_err(), "the wait was cut");
    }
    assert_eq!(
        again.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    );
    let dir = a.lock_path("x").unwrap();
    let client = raw(&server).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while client.list_children(&dir).await.unwrap().len() != 1 {
        assert!(
            Instant::now() < deadline,
            "nodes of the timed-out and cancelled waiters stayed: {:?}",
            client.list_children(&dir).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(held.release().await.unwrap(), Released::Unlocked);
    assert!(client.list_children(&dir).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_node_fires_lost_and_lets_another_owner_in() {
    let server = ZooKeeperServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let g = a.lock("job").await.unwrap();
    let dir = a.lock_path("job").unwrap();
    let admin = raw(&server).await;
    let node = admin.list_children(&dir).await.unwrap().remove(0);
    admin.delete(&format!("{dir}/{node}"), None).await.unwrap();
    let deleted_at = Instant::now();
    checks::loss_lets_another_owner_in(g, &b, "job", deleted_at, "lost() fired on the deletion")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_suspends_then_loses_the_lock() {
    let server = ZooKeeperServer::start();
    let a = locks(&server).await;
    let g = a.lock("job").await.unwrap();
    assert!(g.is_held());
    server.pause();
    let paused = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fired while the server stayed silent");
    // Noticed within the session timeout, lost a third of it later at most.
    assert!(
        paused.elapsed() <= Duration::from_millis(1_500 + 500 + 300),
        "{:?}",
        paused.elapsed()
    );
    assert!(!g.is_held());
    server.resume();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_leases_do_not_apply_and_hold_until_expiry_gives_back() {
    let server = ZooKeeperServer::start();
    let (a, b) = (locks(&server).await, locks(&server).await);
    let past = a.config().watchdog_lease() * 2;
    checks::session_locks_ignore_leases_and_give_back_on_expiry(&a, &b, past).await;
}

/// A lock taken on a runtime that then ended is still kept: the session lives on the
/// process's background runtime, not on the caller's. Held on another runtime, the
/// guard still holds, is still watched (a deleted node fires `lost()`), and the name is
/// still excluded from others until then.
#[test]
fn a_lock_outlives_the_runtime_that_took_it() {
    let server = ZooKeeperServer::start();
    let rt1 = crate::common::runtime();
    let zk = rt1.block_on(locks(&server));
    let g = rt1.block_on(zk.lock("job")).unwrap();
    let dir = zk.lock_path("job").unwrap();
    drop(rt1);
    let rt2 = crate::common::runtime();
    rt2.block_on(async {
        let other = locks(&server).await;
        // Two session timeouts: a session nobody kept alive would have expired.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            g.is_held(),
            "the guard gave up a lock its session still holds"
        );
        let Err(err) = other.try_lock("job").await else {
            panic!("another session took a name that is still held");
        };
        assert!(err.is_busy(), "{err}");
        let admin = raw(&server).await;
        let node = admin.list_children(&dir).await.unwrap().remove(0);
        admin.delete(&format!("{dir}/{node}"), None).await.unwrap();
        let fired = tokio::time::timeout(Duration::from_secs(5), g.lost()).await;
        assert!(fired.is_ok(), "lost() did not fire on the node's deletion");
        assert!(!g.is_held(), "the guard still claims the lock");
    });
}
