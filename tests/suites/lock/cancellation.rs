//! A future holding a guard is aborted: the lock is freed at once and renewal stops.

use crate::common;

use std::time::{Duration, Instant};

use common::{client, eventually, exists, script_sha};
use lock_core::{LockConfig, LockOptions};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborted_holder_frees_the_key_and_stops_renewing() {
    let server = RedisServer::start();
    // Renewal every 100 ms, so missing renewals would show quickly.
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let c = client(&server, config).await;
    let hash = c.keys("task").unwrap().key;
    let (held_tx, held_rx) = tokio::sync::oneshot::channel();
    let task = {
        let c = c.clone();
        tokio::spawn(async move {
            let _guard = c.lock("task").await.unwrap();
            held_tx.send(()).unwrap();
            std::future::pending::<()>().await;
        })
    };
    held_rx.await.unwrap();
    // Renewals really happen while it is held.
    let mut monitor = server.monitor().await;
    let renew = script_sha("renew.lua");
    let lines = monitor.lines_within(Duration::from_millis(450)).await;
    assert!(
        lines.iter().any(|l| l.contains(&renew)),
        "no renewal seen while held"
    );

    let aborted_at = Instant::now();
    task.abort();
    let _ = task.await;
    eventually(
        Duration::from_millis(100),
        "the key to be deleted",
        || async { !exists(&server, &hash).await },
    )
    .await;
    assert!(aborted_at.elapsed() < Duration::from_millis(100));
    assert_eq!(c.held_count(), 0);
    let _ = monitor.lines_within(Duration::from_millis(20)).await;
    let after = monitor.lines_within(Duration::from_millis(500)).await;
    assert!(
        !after.iter().any(|l| l.contains(&renew)),
        "renewal traffic after the guard was dropped: {after:?}"
    );
}

/// A waiter that gives up (its future dropped) leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiter_leaves_no_state() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let g = c.try_lock("busy").await.unwrap();
    let other = client(&server, LockConfig::new()).await;
    let wait = other.acquire("busy", LockOptions::new().wait(Duration::from_secs(30)));
    assert!(
        tokio::time::timeout(Duration::from_millis(200), wait)
            .await
            .is_err()
    );
    assert_eq!(other.held_count(), 0);
    let channel = other.keys("busy").unwrap().channel();
    eventually(
        Duration::from_secs(2),
        "the waiter's unsubscribe",
        || async { common::subscribers(&server, &channel).await == 0 },
    )
    .await;
    g.release().await.unwrap();
}

/// An acquisition dropped while its request is in flight (Redis paused, so the script
/// runs only later and grants a 30 s lease) is undone right after, not left for the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_dropped_mid_request_is_undone() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let hash = c.keys("orphan").unwrap().key;
    // Fenced, so the grant goes through the script and moves the fencing counter
    // (which shows below that it really was granted). Load the scripts first, so the
    // in-flight EVALSHA grants rather than gets NOSCRIPT.
    let fenced = || LockOptions::new().wait(Duration::ZERO).fenced();
    c.acquire("warm-up", fenced())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.pause();
    let attempt =
        tokio::time::timeout(Duration::from_millis(300), c.acquire("orphan", fenced())).await;
    assert!(attempt.is_err(), "the paused server cannot have answered");
    assert_eq!(c.held_count(), 0);
    server.resume();
    eventually(
        Duration::from_secs(2),
        "the granted-but-orphaned lock to be freed",
        || async { !exists(&server, &hash).await },
    )
    .await;
    // It really had been granted: the fencing counter moved.
    let mut raw = server.connection().await;
    let fence: Option<u64> = redis::cmd("GET")
        .arg(c.keys("orphan").unwrap().fence())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(fence, Some(1));
    let g = c.acquire("orphan", fenced()).await.unwrap();
    assert_eq!(g.fencing_token().unwrap().get(), 2);
    g.release().await.unwrap();
}
