//! A Redis server at its `maxmemory` (under `noeviction`, the only policy a client
//! accepts) refuses what would add data, and still takes back and keeps alive what is
//! held: a release frees its lock (a plain one, or a read or write hold), the watchdog
//! renews a held one (of either kind), an idempotency claim is abandoned or extended,
//! semaphore permits are extended and given back (and counted), a fair lock's waiter leaves its line.

use crate::common;

use std::time::Duration;

use common::{client, eventually, exists, pttl};
use lock_core::{Begin, Lease, LockConfig, LockOptions, Released};
use lock_tests::RedisServer;

async fn set_maxmemory(server: &RedisServer, bytes: u64) {
    let mut c = server.connection().await;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(bytes)
        .exec_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_still_takes_back_and_keeps_what_is_held() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(900);
    let c = client(&server, LockConfig::new().with_watchdog_lease(lease)).await;
    let now = LockOptions::new().wait(Duration::ZERO);
    let kept = c.acquire("kept", now.clone()).await.unwrap();
    let kept_reader = c.acquire("kept-shared", now.clone().read()).await.unwrap();
    let kept_writer = c
        .acquire("kept-exclusive", now.clone().write())
        .await
        .unwrap();
    let fixed = now.lease(Lease::Fixed(Duration::from_secs(60)));
    let freed = c.acquire("freed", fixed.clone()).await.unwrap();
    let reader = c.acquire("shared", fixed.clone().read()).await.unwrap();
    let writer = c.acquire("exclusive", fixed.clone().write()).await.unwrap();
    let store = c.idempotency_store("full");
    let claim = |key: &'static str| {
        let store = store.clone();
        async move {
            match store
                .begin(key, "fp", Duration::from_secs(60))
                .await
                .unwrap()
            {
                Begin::New(claim) => claim,
                other => panic!("{key}: expected a new claim, got {other:?}"),
            }
        }
    };
    let (abandoned, extended) = (claim("abandoned").await, claim("extended").await);
    let semaphore = c.semaphore("slots", 2).unwrap();
    let permits = semaphore.try_acquire(2).await.unwrap();
    // A fair lock held, and a waiter in its line (which ends while the server is full).
    let head = c.acquire("line", fixed.fair()).await.unwrap();
    let line = head.keys().key.clone();
    let (queue, deadlines) = (format!("{line}:queue"), format!("{line}:timeouts"));
    let waiter = tokio::spawn({
        let c = c.clone();
        let wait = LockOptions::new().fair().wait(lease * 3);
        async move { c.acquire("line", wait).await.map(|_| ()) }
    });
    eventually(Duration::from_secs(5), "the waiter in the line", || {
        exists(&server, &queue)
    })
    .await;

    set_maxmemory(&server, 1).await;

    // What would add data is refused, with the server's own words.
    let e = c.try_lock("new").await.unwrap_err();
    assert!(e.to_string().contains("OOM"), "{e}");

    assert_eq!(freed.release().await.unwrap(), Released::Unlocked);
    let freed_key = c.keys("freed").unwrap().key;
    assert!(
        !exists(&server, &freed_key).await,
        "the release left its lock"
    );

    // A read-write lock's key is a hash of its holders: gone with the last one.
    for (name, hold) in [("shared", reader), ("exclusive", writer)] {
        let key = hold.keys().key.clone();
        assert_eq!(hold.release().await.unwrap(), Released::Unlocked, "{name}");
        assert!(
            !exists(&server, &key).await,
            "the release left {name}'s hold"
        );
    }

    let record = abandoned.keys().record.clone();
    abandoned.abandon().await.unwrap();
    assert!(
        !exists(&server, &record).await,
        "the abandon left its claim"
    );
    // A fresh in-flight lease of 60 s, against the few seconds that have passed.
    extended.extend().await.unwrap();
    assert!(pttl(&server, &extended.keys().record).await > 59_000);

    // Counting permits writes nothing, so a full server answers it.
    assert_eq!(semaphore.available().await.unwrap(), 0);
    // Extending moves held permits' expiry, adding nothing.
    assert_eq!(permits.extend(Duration::from_secs(120)).await.unwrap(), 2);
    assert!(permits.valid_for() > Duration::from_secs(100));
    assert_eq!(permits.release().await.unwrap(), 2);
    assert_eq!(semaphore.available().await.unwrap(), 2);
    let held: i64 = redis::cmd("ZCARD")
        .arg(semaphore.key())
        .query_async(&mut server.connection().await)
        .await
        .unwrap();
    assert_eq!(held, 0, "the permits are still in the semaphore");

    // Three leases while full: only the watchdog's renewals keep the locks (a plain
    // one, a read and a write hold).
    let until = tokio::time::Instant::now() + lease * 3;
    while tokio::time::Instant::now() < until {
        for guard in [&kept, &kept_reader, &kept_writer] {
            let name = guard.keys().name().to_owned();
            assert!(guard.is_held(), "the watchdog lost {name} on a full server");
            assert!(
                exists(&server, &guard.keys().key).await,
                "{name} expired while held"
            );
        }
        tokio::time::sleep(lease / 4).await;
    }

    // Its wait over (its attempts refused), the waiter left: the line is empty.
    assert!(
        waiter.await.unwrap().is_err(),
        "the waiter took a held lock"
    );
    for key in [&queue, &deadlines] {
        assert!(
            !exists(&server, key).await,
            "the waiter that left is still in {key}"
        );
    }

    set_maxmemory(&server, 0).await;
    let new = c.try_lock("new").await.unwrap();
    assert_eq!(new.release().await.unwrap(), Released::Unlocked);
    for guard in [kept, kept_reader, kept_writer] {
        assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
    }
    assert_eq!(head.release().await.unwrap(), Released::Unlocked);
}
