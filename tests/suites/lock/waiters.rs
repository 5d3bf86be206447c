//! Waiting: one pub/sub connection per client, reference-counted channels, no spinning.

use crate::common;

use std::time::Duration;

use common::{
    client, client_commands_on, eventually, readers_within, script_sha, set_by_hand, steady_backoff,
};
use lock_core::{Backoff, LockConfig, LockOptions};
use lock_tests::RedisServer;

async fn pubsub_clients(server: &RedisServer) -> usize {
    let mut raw = server.connection().await;
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
        .unwrap();
    list.lines().filter(|l| !l.trim().is_empty()).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_connection_and_do_not_spin() {
    let server = RedisServer::start();
    let holder = client(&server, LockConfig::new()).await;
    let waiting = client(&server, LockConfig::new()).await;
    let names = ["a", "b", "c"];
    let guards: Vec<_> = {
        let mut v = Vec::new();
        for n in names {
            v.push(holder.try_lock(n).await.unwrap());
        }
        v
    };
    let mut monitor = server.monitor().await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let w = waiting.clone();
        let name = names[i % 3];
        tasks.push(tokio::spawn(async move {
            let g = w
                .acquire(name, LockOptions::new().wait(Duration::from_secs(20)))
                .await
                .unwrap();
            g.release().await.unwrap();
        }));
    }
    eventually(
        Duration::from_secs(5),
        "3 channels with 1 subscriber each",
        || async {
            let mut raw = server.connection().await;
            let mut cmd = redis::cmd("PUBSUB");
            cmd.arg("NUMSUB");
            for n in names {
                cmd.arg(waiting.keys(n).unwrap().channel());
            }
            let subs: Vec<(String, i64)> = cmd.query_async(&mut raw).await.unwrap();
            subs.iter().all(|(_, n)| *n == 1)
        },
    )
    .await;
    assert_eq!(
        pubsub_clients(&server).await,
        1,
        "one pub/sub connection per client"
    );

    // Held for 1.5 s: count the acquire attempts of 30 waiters meanwhile.
    let lines = monitor.lines_within(Duration::from_millis(1500)).await;
    let acquire = script_sha("acquire.lua");
    let attempts = lines.iter().filter(|l| l.contains(&acquire)).count();
    assert!(
        attempts < 30 * 12,
        "waiters spin: {attempts} attempts in 1.5 s"
    );

    for g in guards {
        g.release().await.unwrap();
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(10), t)
            .await
            .expect("every waiter gets its turn")
            .unwrap();
    }
    eventually(Duration::from_secs(2), "channels unsubscribed", || async {
        let mut raw = server.connection().await;
        let chans: Vec<String> = redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query_async(&mut raw)
            .await
            .unwrap();
        chans.is_empty()
    })
    .await;
}

/// Built on the user's own connection without a pub/sub client: waiters are woken by
/// this client's own releases, and otherwise poll with backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_user_connection_without_pubsub() {
    let server = RedisServer::start();
    let manager = redis::aio::ConnectionManager::new(server.client())
        .await
        .unwrap();
    // A slow fallback, so only the local wake-up can hand the lock over quickly.
    let slow = steady_backoff(Duration::from_secs(5));
    let config = LockConfig::new().with_backoff(slow);
    let c = lock_core::LockClient::from_connection(manager, None, config).unwrap();
    let g = c.try_lock("own").await.unwrap();
    let mut monitor = server.monitor().await;
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { c.lock("own").await })
    };
    // First attempt, then the retry after subscribing: now it sleeps.
    let acquire = script_sha("acquire.lua");
    monitor
        .wait_for_times(&acquire, 2, Duration::from_secs(2))
        .await
        .expect("the waiter's attempt");
    g.release().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_millis(300), waiter)
        .await
        .expect("woken by the local release, not the 5 s backoff")
        .unwrap()
        .unwrap();
    assert_eq!(
        pubsub_clients(&server).await,
        0,
        "no pub/sub connection was opened"
    );
    g2.release().await.unwrap();
}

/// The pub/sub connection is killed while a waiter waits: the hub reconnects,
/// resubscribes, and the next release still wakes the waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_connection_loss_is_repaired() {
    let server = RedisServer::start();
    let holder = client(&server, LockConfig::new()).await;
    let slow = steady_backoff(Duration::from_secs(5));
    let waiting = client(&server, LockConfig::new().with_backoff(slow)).await;
    let g = holder.try_lock("phoenix").await.unwrap();
    let waiter = {
        let w = waiting.clone();
        tokio::spawn(async move { w.lock("phoenix").await })
    };
    let channel = waiting.keys("phoenix").unwrap().channel();
    let numsub = || common::subscribers(&server, &channel);
    eventually(
        Duration::from_secs(2),
        "the waiter's subscription",
        || async { numsub().await == 1 },
    )
    .await;
    let mut raw = server.connection().await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    eventually(
        Duration::from_secs(3),
        "the subscription to come back",
        || async { numsub().await == 1 },
    )
    .await;
    g.release().await.unwrap();
    let g2 = tokio::time::timeout(Duration::from_secs(1), waiter)
        .await
        .expect("woken through the new pub/sub connection")
        .unwrap()
        .unwrap();
    g2.release().await.unwrap();
}

/// A lock key without expiry (written by something other than this crate) gives a
/// waiter no lease to wait for: it backs off as it would without a hint instead of
/// asking every millisecond, and `try_lock` says to come back after the longest backoff
/// step rather than at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_without_expiry_is_waited_for_with_backoff_not_polled() {
    let server = RedisServer::start();
    let longest = Backoff::default().max;
    let c = client(&server, LockConfig::new()).await;
    let key = c.keys("by-hand").unwrap().key;
    set_by_hand(&server, &key, "written by another program").await;
    let mut monitor = server.monitor().await;
    let waited = c
        .acquire(
            "by-hand",
            LockOptions::new().wait(Duration::from_millis(600)),
        )
        .await
        .unwrap_err();
    assert!(waited.is_timeout(), "{waited:?}");
    let attempts = client_commands_on(&server, &mut monitor, &key).await;
    // Backoff from 20 ms doubling (full jitter) asks about ten times in 600 ms, two
    // commands each (19 seen); a waiter asking every millisecond sent over 300.
    assert!(
        attempts < 60,
        "the waiter polled: {attempts} commands on the key in 600 ms"
    );
    let busy = c.try_lock("by-hand").await.unwrap_err();
    assert_eq!(busy.retry_after(), Some(longest), "{busy:?}");
}

/// A write hold given back, with several readers of one client waiting: the release's
/// message wakes one of them, and each reader that gets its hold wakes the next, so all
/// go in together instead of one per backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_release_lets_every_waiting_reader_in() {
    let server = RedisServer::start();
    let writer = client(&server, LockConfig::new()).await;
    // A backoff (full jitter) so long that a reader woken by it within the 2 s below
    // is rare, three of them all but impossible.
    let slow = steady_backoff(Duration::from_secs(60));
    // Unbatched, so that each attempt is a call of its own to count.
    let config = LockConfig::new().with_backoff(slow).with_batching(false);
    let readers = client(&server, config).await;
    let w = writer
        .acquire("doc", LockOptions::new().write())
        .await
        .unwrap();
    let mut monitor = server.monitor().await;
    let waiting: Vec<_> = (0..4)
        .map(|_| {
            let r = readers.clone();
            tokio::spawn(async move {
                let read = LockOptions::new().read().wait(Duration::from_secs(60));
                r.acquire("doc", read).await
            })
        })
        .collect();
    // Each reader's first attempt, then its retry once subscribed: all four asleep.
    let take = script_sha("read_write.lua");
    monitor
        .wait_for_times(&take, 8, Duration::from_secs(5))
        .await
        .expect("a reader's attempt");
    w.release().await.unwrap();
    let late = "waited for its backoff, not the release";
    for g in readers_within(waiting, Duration::from_secs(2), late).await {
        g.release().await.unwrap();
    }
}
