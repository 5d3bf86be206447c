//! `RFairLock`: one line of Java and Rust waiters, each woken on its own channel.

use std::time::Duration;

use lock_core::{LockError, LockOptions};
use lock_tests::RedisServer;

use super::{Java, Listener, locks};
use crate::checks;
use crate::common::eventually;

async fn line(server: &RedisServer, name: &str) -> Vec<String> {
    let mut c = server.connection().await;
    redis::cmd("LRANGE")
        .arg(format!("redisson_lock_queue:{{{name}}}"))
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn java_and_rust_waiters_stand_in_one_line_and_wake_each_other() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    let wait = Duration::from_secs(60);
    assert_eq!(java.fair_lock("printer", 1, wait).await, None, "free");
    assert!(java.fair_lock("printer", 2, wait).await.is_some(), "queues");

    let ours = checks::waiting(&locks, "printer", LockOptions::new().fair());
    eventually(Duration::from_secs(5), "our waiter queued", || async {
        line(&server, "printer").await.len() == 2
    })
    .await;
    let queue = line(&server, "printer").await;
    assert_eq!(queue[0], java.field(2), "the Java waiter came first");

    let mut second = Listener::on(
        &server,
        &format!("redisson_lock__channel:{{printer}}:{}", java.field(2)),
    )
    .await;
    assert_eq!(java.fair_unlock("printer", 1).await, Some(1));
    assert_eq!(second.next("the head woken").await, "0");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!ours.is_finished(), "granted before the head of the line");
    assert_eq!(
        java.fair_lock("printer", 2, wait).await,
        None,
        "the head takes it"
    );
    assert_eq!(line(&server, "printer").await, vec![queue[1].clone()]);

    assert_eq!(java.fair_unlock("printer", 2).await, Some(1));
    let g = checks::granted(ours, "woken on our own channel by Redisson's unlock").await;
    assert_eq!(queue[1], g.field(), "our place was our hold's field");

    assert!(
        java.fair_lock("printer", 3, wait).await.is_some(),
        "queues behind us"
    );
    let mut third = Listener::on(
        &server,
        &format!("redisson_lock__channel:{{printer}}:{}", java.field(3)),
    )
    .await;
    g.release().await.unwrap();
    assert_eq!(third.next("our unlock wakes the Java head").await, "0");
    assert_eq!(java.fair_lock("printer", 3, wait).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_waiter_that_gives_up_leaves_the_line_and_moves_the_rest_up() {
    let server = RedisServer::start();
    let locks = locks(&server).await.with_fair_wait(Duration::from_secs(60));
    let mut java = Java::new(&server).await;
    let wait = Duration::from_secs(60);
    assert_eq!(java.fair_lock("printer", 1, wait).await, None);

    let ours = checks::waiting(
        &locks,
        "printer",
        LockOptions::new().fair().wait(Duration::from_millis(400)),
    );
    eventually(Duration::from_secs(5), "our waiter queued", || async {
        line(&server, "printer").await.len() == 1
    })
    .await;
    assert!(
        java.fair_lock("printer", 2, wait).await.is_some(),
        "queues behind us"
    );
    let mut c = server.connection().await;
    let score = |c: &mut redis::aio::MultiplexedConnection, field: String| {
        let mut c = c.clone();
        async move {
            let s: f64 = redis::cmd("ZSCORE")
                .arg("redisson_lock_timeout:{printer}")
                .arg(field)
                .query_async(&mut c)
                .await
                .unwrap();
            s
        }
    };
    let before = score(&mut c, java.field(2)).await;
    let err = ours.await.unwrap().map(drop).unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    assert_eq!(
        line(&server, "printer").await,
        vec![java.field(2)],
        "we left"
    );
    let after = score(&mut c, java.field(2)).await;
    assert_eq!(
        before - after,
        60_000.0,
        "the one behind moved up one wait time"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_try_takes_no_place_and_never_passes_a_java_head() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut java = Java::new(&server).await;
    let wait = Duration::from_secs(60);
    let try_fair = || locks.acquire("printer", LockOptions::new().fair().wait(Duration::ZERO));
    assert_eq!(java.fair_lock("printer", 1, wait).await, None);
    assert!(java.fair_lock("printer", 2, wait).await.is_some());
    assert!(try_fair().await.unwrap_err().is_busy());
    assert_eq!(
        line(&server, "printer").await,
        vec![java.field(2)],
        "no place taken"
    );
    assert_eq!(java.fair_unlock("printer", 1).await, Some(1));
    assert!(
        try_fair().await.unwrap_err().is_busy(),
        "free, but the Java waiter heads the line"
    );
    assert_eq!(java.fair_lock("printer", 2, wait).await, None);
    assert_eq!(java.fair_unlock("printer", 2).await, Some(1));
    let g = try_fair().await.expect("free, nobody in line");
    g.release().await.unwrap();
}
