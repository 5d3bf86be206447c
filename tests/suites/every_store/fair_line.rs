//! The line of a fair lock on Redis and in memory lets a waiter go without stalling the
//! ones behind it: a waiter that leaves (a timeout, a cancelled future) gives up its
//! place at once; one that vanished (crashed, cut off, a future forgotten) holds the
//! line up until its place lapses, one place lease after its last attempt, and no
//! longer. Nobody takes the lock past a live place, not even a waiter that does not
//! wait.

use std::time::Duration;

use lock_core::{Backoff, DistributedLock, HeldLock, LockConfig, LockError, LockOptions};
use lock_tests::RedisServer;

use super::arrival_order::redis_line;
use crate::common::eventually;

/// A place lease (the backoff's longest sleep plus the command timeout) of 12 s: far
/// longer than any wait below, so a waiter that did not leave would be seen.
fn long_places() -> LockConfig {
    LockConfig::new()
        .with_backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_secs(10),
        })
        .with_command_timeout(Duration::from_secs(2))
}

fn fair(wait: Duration) -> LockOptions {
    LockOptions::new().fair().wait(wait)
}

/// A holder, then waiter A (which leaves: timed out, or cancelled), then waiter B. Once
/// A's place is gone, the holder's release goes to B well within A's place lease.
async fn a_leaving_waiter_gives_up_its_place<L, F>(locks: L, in_line: F)
where
    L: DistributedLock + Clone + Send + Sync + 'static,
    F: Fn() -> usize,
{
    let held = locks.lock_named("door").await.unwrap();
    for cancelled in [false, true] {
        let a = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let wait = if cancelled { 60 } else { 1 };
                locks.acquire("door", fair(Duration::from_secs(wait))).await
            })
        };
        eventually(Duration::from_secs(5), "A stands in line", || async {
            in_line() == 1
        })
        .await;
        if cancelled {
            a.abort();
            assert!(a.await.err().expect("A was cancelled").is_cancelled());
        } else {
            let refused = a.await.unwrap().err().expect("A cannot get the lock");
            assert!(matches!(refused, LockError::Timeout { .. }), "{refused:?}");
        }
        eventually(Duration::from_secs(5), "A left the line", || async {
            in_line() == 0
        })
        .await;
    }
    let a = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("door", fair(Duration::from_secs(60))).await })
    };
    eventually(Duration::from_secs(5), "A stands in line", || async {
        in_line() == 1
    })
    .await;
    let b = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("door", fair(Duration::from_secs(60))).await })
    };
    eventually(Duration::from_secs(5), "B stands behind A", || async {
        in_line() == 2
    })
    .await;
    a.abort();
    assert!(a.await.err().expect("A was cancelled").is_cancelled());
    held.release().await.unwrap();
    eventually(Duration::from_secs(5), "B has the lock", || async {
        b.is_finished()
    })
    .await;
    b.await.unwrap().unwrap().release().await.unwrap();
    assert_eq!(in_line(), 0, "nobody stands in line");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_leaving_waiter_gives_up_its_place() {
    let locks = lock_core::MemoryLocks::with_config(long_places()).unwrap();
    let probe = locks.clone();
    a_leaving_waiter_gives_up_its_place(locks, move || probe.in_line("door").unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_leaving_waiter_gives_up_its_place() {
    let server = RedisServer::start();
    let locks = lock_core::LockClient::open_with_config(server.url(), long_places())
        .await
        .unwrap();
    let client = server.client();
    let in_line = move || -> usize {
        let mut conn = client.get_connection().unwrap();
        redis::cmd("LLEN")
            .arg("lock:{door}:queue")
            .query(&mut conn)
            .unwrap()
    };
    a_leaving_waiter_gives_up_its_place(locks, in_line).await;
}

/// The server's clock in milliseconds.
async fn server_ms(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    s * 1000 + us / 1000
}

/// A waiter that crashed leaves its place behind, as a line entry with a deadline: the
/// free lock goes to nobody past it (a try is refused, a waiter waits) until the
/// deadline passes, then to the next waiter, and the lapsed place is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_vanished_waiter_holds_the_line_until_its_place_lapses() {
    let server = RedisServer::start();
    let locks = lock_core::LockClient::open_with_config(server.url(), LockConfig::new())
        .await
        .unwrap();
    let mut raw = server.connection().await;
    let lapses = server_ms(&mut raw).await + 1_500;
    let _: () = redis::pipe()
        .cmd("RPUSH")
        .arg("lock:{gate}:queue")
        .arg("crashed:1")
        .cmd("ZADD")
        .arg("lock:{gate}:timeouts")
        .arg(lapses)
        .arg("crashed:1")
        .query_async(&mut raw)
        .await
        .unwrap();
    let refused = locks
        .acquire("gate", fair(Duration::ZERO))
        .await
        .expect_err("the line's head comes first");
    let LockError::Busy { retry_after, .. } = refused else {
        panic!("{refused:?}")
    };
    assert!(
        retry_after > Duration::ZERO && retry_after <= Duration::from_millis(1_500),
        "told to come back when the place lapses, not {retry_after:?}"
    );
    let plain = locks
        .try_lock("gate")
        .await
        .expect("a plain lock does not queue");
    plain.release().await.unwrap();
    let g = locks
        .acquire("gate", fair(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        server_ms(&mut raw).await >= lapses,
        "granted before the vanished waiter's place lapsed"
    );
    let left: (usize, usize) = redis::pipe()
        .cmd("LLEN")
        .arg("lock:{gate}:queue")
        .cmd("ZCARD")
        .arg("lock:{gate}:timeouts")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(left, (0, 0), "the lapsed place is gone");
    g.release().await.unwrap();
}

/// In memory a vanished waiter is a future forgotten mid-wait: its place stays until it
/// lapses, then the lock goes to the next waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_vanished_waiter_holds_the_line_until_its_place_lapses() {
    let config = LockConfig::new()
        .with_backoff(Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(200),
        })
        .with_command_timeout(Duration::from_millis(300));
    let place = Duration::from_millis(500);
    let locks = lock_core::MemoryLocks::with_config(config).unwrap();
    let held = locks.lock_named("gate").await.unwrap();
    let queued = tokio::time::Instant::now();
    let mut vanished = Box::pin(locks.acquire("gate", fair(Duration::from_secs(60))));
    assert!(futures_util::poll!(vanished.as_mut()).is_pending());
    std::mem::forget(vanished);
    assert_eq!(locks.in_line("gate").unwrap(), 1);
    held.release().await.unwrap();
    let refused = locks.acquire("gate", fair(Duration::ZERO)).await;
    assert!(
        matches!(refused, Err(LockError::Busy { .. })),
        "{refused:?}"
    );
    let g = locks
        .acquire("gate", fair(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        queued.elapsed() >= place,
        "granted {:?} after the vanished waiter queued, within its place",
        queued.elapsed()
    );
    assert_eq!(
        locks.in_line("gate").unwrap(),
        0,
        "the lapsed place is gone"
    );
    g.release().await.unwrap();
}

/// Where a store keeps no line, a fair lock is refused before any call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_and_read_write_locks_refuse_fair() {
    let masters = RedisServer::start_many(3);
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    let redlock =
        lock_core::AnyLocks::open(&format!("redlock://{}", hosts.join(",")), LockConfig::new())
            .await
            .unwrap();
    let refused = redlock.acquire("gate", fair(Duration::ZERO)).await;
    assert!(
        matches!(refused, Err(LockError::Unsupported { .. })),
        "{refused:?}"
    );
    let memory = lock_core::MemoryLocks::new();
    for mode in [fair(Duration::ZERO).read(), fair(Duration::ZERO).write()] {
        let refused = memory.acquire("gate", mode).await;
        assert!(
            matches!(refused, Err(LockError::Unsupported { .. })),
            "{refused:?}"
        );
    }
}

/// A release wakes only the head of the line, so each grant out of the line marks the
/// lock as waited for again while others stand in it: the next release then wakes
/// the next head at once, not after its backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_each_grant_from_the_line_keeps_the_next_head_woken() {
    let server = RedisServer::start();
    // Backoff sleeps of up to 10 s from the first: a waiter nobody wakes stays asleep.
    let config = LockConfig::new().with_backoff(Backoff {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(10),
    });
    let locks = lock_core::LockClient::open_with_config(server.url(), config)
        .await
        .unwrap();
    let mut raw = server.connection().await;
    let in_line = redis_line(raw.clone(), "relay");
    let held = locks.lock_named("relay").await.unwrap();
    let mut waiters = Vec::new();
    for queued in 1..=3 {
        let locks = locks.clone();
        waiters.push(tokio::spawn(async move {
            locks
                .acquire("relay", fair(Duration::from_secs(60)))
                .await
                .unwrap()
        }));
        eventually(Duration::from_secs(5), "the waiter queued", || {
            let shown = in_line();
            async move { shown.await == queued }
        })
        .await;
    }
    held.release().await.unwrap();
    for (i, w) in waiters.into_iter().enumerate() {
        let g = tokio::time::timeout(Duration::from_secs(5), w)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} was not woken"))
            .unwrap();
        if i < 2 {
            let marked: bool = redis::cmd("EXISTS")
                .arg("lock:{relay}:waiters")
                .query_async(&mut raw)
                .await
                .unwrap();
            assert!(marked, "waiter {i} holds with others in line, unmarked");
        }
        g.release().await.unwrap();
    }
}
