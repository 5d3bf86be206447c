//! A hold's lease on the server never ends before its guard stops believing in it. In
//! Redisson's layout the holds of a name share one key and so one expiry: a renewal or a
//! grant of one hold must not shorten the expiry another hold (or an earlier grant of
//! the same field, still on its way) counts on.

use std::time::{Duration, Instant};

use lock_core::{
    Lease, LockClient, LockConfig, LockOptions, LockScope, RedissonGuard, RedissonLocks,
};
use lock_tests::RedisServer;

use crate::common::{eventually, pttl};

const WATCHDOG_LEASE: Duration = Duration::from_millis(300);

async fn locks(server: &RedisServer) -> RedissonLocks {
    let config = LockConfig::new().with_watchdog_lease(WATCHDOG_LEASE);
    let client = LockClient::open_with_config(server.url().as_str(), config)
        .await
        .unwrap();
    RedissonLocks::new(&client)
}

/// How many script calls the server has run: a renewal is one.
async fn script_calls(server: &RedisServer) -> u64 {
    let mut c = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Watches `key` through at least `calls` more script calls (renewals of the
/// watchdog), failing as soon as `believer` counts on more than the key has left.
async fn outlives_its_believer(
    server: &RedisServer,
    key: &str,
    believer: &RedissonGuard,
    calls: u64,
) {
    let before = script_calls(server).await;
    eventually(Duration::from_secs(5), "renewals", || async {
        // The server's end is fixed once read; the guard's belief, read after, must end
        // no later (PTTL is whole milliseconds).
        let left = Duration::from_millis(pttl(server, key).await.max(0) as u64 + 1);
        let read = Instant::now();
        let believed = believer.valid_for();
        assert!(
            believed <= left + read.elapsed(),
            "the guard counts on {believed:?}, the key {key} has {left:?} left"
        );
        script_calls(server).await >= before + calls
    })
    .await;
}

fn fixed() -> LockOptions {
    LockOptions::new().lease(Lease::Fixed(Duration::from_secs(5)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_a_reentered_hold_keeps_its_longer_fixed_lease() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    for fair in [false, true] {
        let scope = LockScope::new();
        let options = |o: LockOptions| if fair { o.fair() } else { o };
        let long = locks
            .acquire(("order", 7_u64), options(fixed()).scope(&scope))
            .await
            .unwrap();
        // The same grant, now watched: renewed every 100 ms with a 300 ms lease.
        let watched = locks
            .acquire(("order", 7_u64), options(LockOptions::new()).scope(&scope))
            .await
            .unwrap();
        outlives_its_believer(&server, "order:7", &long, 3).await;
        drop(watched);
        long.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_one_reader_keeps_another_readers_longer_lease() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let long = locks
        .acquire("catalog", fixed().read().scope(&LockScope::new()))
        .await
        .unwrap();
    let watched = locks
        .acquire(
            "catalog",
            LockOptions::new().read().scope(&LockScope::new()),
        )
        .await
        .unwrap();
    outlives_its_believer(&server, "catalog", &long, 3).await;
    watched.release().await.unwrap();
    // The other reader's give-back leaves the hash to the longest hold left.
    outlives_its_believer(&server, "catalog", &long, 0).await;
    long.release().await.unwrap();
}

/// A watched hold kept past its first lease is still its grant's: renewals carry the
/// grant's evidence along, so the release gives it back at once, in every kind of hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_hold_kept_past_its_first_lease_is_given_back() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    for (n, (kind, options)) in super::every_kind().into_iter().enumerate() {
        let guard = locks.acquire(("kept", n), options).await.unwrap();
        let key = format!("kept:{n}");
        let granted = Instant::now();
        // Renewed every 100 ms: four renewals take it past the 300 ms it was granted.
        let before = script_calls(&server).await;
        eventually(Duration::from_secs(5), "renewals", || async {
            script_calls(&server).await >= before + 4 && granted.elapsed() > WATCHDOG_LEASE
        })
        .await;
        assert!(guard.valid_for() > Duration::ZERO, "{kind}: still held");
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{kind}: the release was refused: {e}"));
        assert_eq!(pttl(&server, &key).await, -2, "{kind}: the lock is free");
    }
}

/// A watched hold whose key another program overwrote with a string is lost, and only
/// it: the holds of every kind renewed in the same passes go on being renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_whose_key_holds_another_type_is_lost_alone() {
    let server = RedisServer::start();
    let locks = locks(&server).await;
    let mut kept = Vec::new();
    for (n, (kind, options)) in super::every_kind().into_iter().enumerate() {
        let guard = locks.acquire(("kept", n), options).await.unwrap();
        kept.push((kind, guard));
    }
    let gone = locks
        .acquire("overwritten", LockOptions::new())
        .await
        .unwrap();
    redis::cmd("SET")
        .arg("overwritten")
        .arg("not a hash")
        .exec_async(&mut server.connection().await)
        .await
        .unwrap();
    tokio::time::timeout(WATCHDOG_LEASE * 2, gone.lost())
        .await
        .expect("the overwritten hold was not reported lost");
    // Three leases on, the others are still held: renewed pass after pass.
    tokio::time::sleep(WATCHDOG_LEASE * 3).await;
    for (n, (kind, guard)) in kept.into_iter().enumerate() {
        assert!(guard.is_held(), "the {kind} hold was lost");
        assert!(pttl(&server, &format!("kept:{n}")).await > 0, "{kind}");
        guard.release().await.unwrap();
    }
}
