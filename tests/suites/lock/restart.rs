//! Redis killed and restarted on the same port mid-run.

use crate::common;

use std::time::{Duration, Instant};

use common::{client, eventually};
use lock_core::{LockConfig, LockOptions};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outage_gives_errors_and_the_same_client_recovers() {
    let mut server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let config = LockConfig::new()
        .with_command_timeout(timeout)
        .with_watchdog_lease(Duration::from_millis(600));
    let c = client(&server, config).await;
    c.try_lock("k").await.unwrap().release().await.unwrap();
    let survivor = c.try_lock("held-across").await.unwrap();

    server.kill();
    let budget = Duration::from_secs(1);
    for _ in 0..3 {
        let start = Instant::now();
        let e = c.try_lock("k").await.unwrap_err();
        assert!(e.is_redis(), "{e}");
        assert!(
            start.elapsed() < timeout + Duration::from_millis(500),
            "try_lock hung"
        );
        let start = Instant::now();
        let e = c
            .acquire("k", LockOptions::new().wait(budget))
            .await
            .unwrap_err();
        assert!(e.is_redis(), "{e}");
        assert!(
            start.elapsed() < budget + timeout,
            "lock hung past its budget"
        );
    }
    // The holder cannot renew: its lease runs out and it is told.
    tokio::time::timeout(Duration::from_secs(2), survivor.lost())
        .await
        .expect("lost() during the outage");

    server.restart();
    eventually(
        Duration::from_secs(10),
        "the client to reconnect",
        || async {
            match c.try_lock("k").await {
                Ok(g) => g.release().await.is_ok(),
                Err(e) => {
                    assert!(e.is_redis(), "{e}");
                    false
                }
            }
        },
    )
    .await;
    // Scripts were flushed by the restart: every script reloads.
    let g = c.lock("k").await.unwrap();
    g.extend(Duration::from_secs(5)).await.unwrap();
    assert!(g.fence().await.unwrap().get() >= 1);
    g.release().await.unwrap();
    let e = survivor.release().await.unwrap_err();
    assert!(e.is_lost(), "{e}");
}
