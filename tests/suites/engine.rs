//! The engine's promises in ordinary use and under faults: each case here broke the
//! previous engine (a shared `{owner -> count}` hash, an eager per-lock fencing
//! counter, loss detection that waited on the renewal call).

mod common;

use std::time::{Duration, Instant};

use common::{client, eventually, exists, get};
use lock_core::{FencedWrite, Lease, LockClient, LockConfig, LockOptions, LockScope, Released};
use lock_tests::{RedisServer, TcpProxy};

async fn pttl(server: &RedisServer, key: &str) -> i64 {
    let mut c = server.connection().await;
    redis::cmd("PTTL")
        .arg(key)
        .query_async(&mut c)
        .await
        .unwrap()
}

/// While `guard` believes it holds `name` for `valid_for`, nobody else can take it and
/// the server shows this grant with at least that much lease left.
async fn assert_really_held(
    server: &RedisServer,
    other: &LockClient,
    guard: &lock_core::LockGuard,
) {
    let t0 = Instant::now();
    let believed = guard.valid_for();
    assert!(
        guard.is_held(),
        "{guard:?} should believe it holds the lock"
    );
    let key = &guard.keys().key;
    assert_eq!(
        get(server, key).await.as_deref(),
        Some(guard.grant_value()),
        "the server shows another grant than the one {guard:?} believes in"
    );
    let left = pttl(server, key).await;
    // PTTL counts down while we ask: add what passed since `believed` was read.
    assert!(
        Duration::from_millis(left as u64 + 1) + t0.elapsed() >= believed,
        "server lease {left} ms is shorter than the {believed:?} the guard believes in"
    );
    let stolen = other.try_lock(guard.name()).await;
    assert!(
        stolen.as_ref().unwrap_err().is_busy(),
        "another client got {stolen:?}"
    );
}

/// Case 1: drop a guard and take the lock again at once in the same scope; the dropped
/// guard's background release must not free the new grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_then_relock_in_the_same_scope_keeps_the_new_grant() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let b = client(&server, LockConfig::new()).await;
    LockScope::new()
        .run(async {
            for round in 0..50 {
                drop(a.lock("x").await.unwrap());
                // `try_lock` at once: this client's own release in flight is waited
                // for, not reported as busy.
                let g2 = if round % 2 == 0 {
                    a.lock("x").await.unwrap()
                } else {
                    a.try_lock("x").await.unwrap()
                };
                assert_really_held(&server, &b, &g2).await;
                // Whatever background work the drop left is over by now.
                tokio::task::yield_now().await;
                assert_really_held(&server, &b, &g2).await;
                g2.release().await.unwrap();
            }
        })
        .await;
}

/// Case 1, second half: a cancelled or timed-out acquisition, then a retry in the
/// same scope.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_or_timed_out_acquisition_then_retry_keeps_the_new_grant() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let b = client(&server, LockConfig::new()).await;
    LockScope::new()
        .run(async {
            for round in 0..40u64 {
                // Cancelled at various points of its request.
                let cut = Duration::from_micros(50 * (round % 8));
                let _ = tokio::time::timeout(cut, a.lock("y")).await;
                let g = a.lock("y").await.unwrap();
                assert_really_held(&server, &b, &g).await;
                tokio::time::sleep(Duration::from_millis(2)).await;
                assert_really_held(&server, &b, &g).await;
                g.release().await.unwrap();
            }
            // Timed out while another client held it, then a retry.
            let theirs = b.try_lock("z").await.unwrap();
            let waited = a
                .acquire("z", LockOptions::new().wait(Duration::from_millis(30)))
                .await;
            assert!(waited.unwrap_err().is_timeout());
            theirs.release().await.unwrap();
            let g = a.lock("z").await.unwrap();
            assert_really_held(&server, &b, &g).await;
            g.release().await.unwrap();
        })
        .await;
}

/// Case 2: a nested hold with a longer lease, released first, must not leave the outer
/// hold believing in more than the server has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_holds_with_different_leases_never_overstate_the_lease() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let b = client(&server, LockConfig::new()).await;
    let fixed = |ms| LockOptions::new().lease(Lease::Fixed(Duration::from_millis(ms)));
    LockScope::new()
        .run(async {
            let started = Instant::now();
            let outer = a.acquire("n", fixed(1000)).await.unwrap();
            let inner = a.acquire("n", fixed(30_000)).await.unwrap();
            assert_eq!(inner.fencing_token(), outer.fencing_token());
            assert_eq!(
                inner.release().await.unwrap(),
                Released::StillHeld { holds_left: 1 }
            );
            // Past the outer hold's own lease: whatever it believes must be true.
            tokio::time::sleep_until((started + Duration::from_millis(1300)).into()).await;
            assert_really_held(&server, &b, &outer).await;
            assert!(outer.valid_for() > Duration::from_secs(25));
            assert_eq!(outer.release().await.unwrap(), Released::Unlocked);

            // The other way round: a short inner lease never shortens the outer one.
            let outer = a.acquire("m", fixed(30_000)).await.unwrap();
            let inner = a.acquire("m", fixed(50)).await.unwrap();
            inner.release().await.unwrap();
            let key = a.keys("m").unwrap().key;
            assert!(pttl(&server, &key).await > 25_000);
            assert_really_held(&server, &b, &outer).await;
            outer.release().await.unwrap();
        })
        .await;
}

/// Case 3: the holder's Redis stops answering (paused): `lost()` fires at the end of the
/// lease the client can prove, on its own timer, not after the renewal call gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_on_time_when_redis_stops_answering() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(500);
    let config = LockConfig::new()
        .with_watchdog_lease(lease)
        .with_command_timeout(Duration::from_secs(5));
    let period = config.watchdog_period();
    let a = client(&server, config).await;
    let g = a.lock("paused").await.unwrap();
    // Let a renewal or two happen.
    tokio::time::sleep(period * 2).await;
    assert!(g.is_held());
    let promised = g.valid_for();
    server.pause();
    let paused_at = Instant::now();
    tokio::time::timeout(lease + period, g.lost())
        .await
        .expect("lost() must fire within a lease and a renewal period of the pause");
    let fired = paused_at.elapsed();
    assert!(
        fired + Duration::from_millis(20) >= promised,
        "lost() fired after {fired:?}, before the {promised:?} the guard promised"
    );
    assert!(!g.is_held());
    assert!(g.valid_for().is_zero());
    server.resume();
    let released = g.release().await;
    assert!(released.unwrap_err().is_lost());
}

/// Case 3 across a real partition: a proxy stops forwarding without closing. The
/// cut-off holder's `lost()` fires within lease + one renewal period; a second holder
/// takes over, and the first one's fenced write after the second's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_holder_learns_it_lost_and_its_fenced_write_is_refused() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let lease = Duration::from_millis(600);
    let config = LockConfig::new()
        .with_watchdog_lease(lease)
        .with_command_timeout(Duration::from_secs(5));
    let period = config.watchdog_period();
    let cut_off = LockClient::open_with_config(proxy.url().as_str(), config.clone())
        .await
        .unwrap();
    let other = client(&server, config).await;
    let first = cut_off.lock("ledger").await.unwrap();
    let first_token = first.fence().await.unwrap();
    assert_eq!(
        cut_off
            .fenced_write("ledger", first_token, "a0")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    proxy.cut();
    let cut_at = Instant::now();
    tokio::time::timeout(lease + period, first.lost())
        .await
        .expect("lost() within lease + one renewal period of the cut");
    assert!(!first.is_held());
    let second = other
        .acquire("ledger", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(cut_at.elapsed() >= lease.saturating_sub(Duration::from_millis(50)));
    let second_token = second.fence().await.unwrap();
    assert!(second_token > first_token);
    assert_eq!(
        other
            .fenced_write("ledger", second_token, "b")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    proxy.heal();
    // The stale holder writes late: refused.
    let late = cut_off
        .fenced_write("ledger", first_token, "a1")
        .await
        .unwrap();
    assert!(
        matches!(late, FencedWrite::Refused { highest } if highest.get() == second_token.get())
    );
    assert_eq!(
        other.fenced_read("ledger").await.unwrap().as_deref(),
        Some(&b"b"[..])
    );
    assert!(first.release().await.unwrap_err().is_not_owner());
    second.release().await.unwrap();
}

/// Case 4: memory is bounded by what is held: 100 000 distinct names locked and
/// released leave only the per-slot fencing counters behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_names_leave_nothing_but_bounded_counters() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let mut raw = server.connection().await;
    let before: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    let tasks: Vec<_> = (0..64u64)
        .map(|t| {
            let a = a.clone();
            tokio::spawn(async move {
                for i in (t..100_000).step_by(64) {
                    a.try_lock(("buyer", i))
                        .await
                        .unwrap()
                        .release()
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let after: i64 = redis::cmd("DBSIZE").query_async(&mut raw).await.unwrap();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    let not_counters: Vec<_> = left
        .iter()
        .filter(|k| !k.starts_with("lock:fence:{"))
        .take(5)
        .collect();
    assert!(not_counters.is_empty(), "left behind: {not_counters:?}");
    assert!(
        after - before <= 16384,
        "{} keys left for 100 000 names: more than one counter per hash slot",
        after - before
    );
    assert_eq!(a.held_count(), 0);
}

/// Case 5: after a failover the promoted replica may hand out the same token again;
/// a fenced write with an equal token from another holder is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_token_from_another_holder_is_refused() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let b = client(&server, LockConfig::new()).await;
    let first = a.try_lock("acct").await.unwrap();
    let t = first.fence().await.unwrap();
    // The failover, reproduced: the lock and the last increment of its counter are
    // missing on the promoted replica.
    let keys = a.keys("acct").unwrap();
    let mut raw = server.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(&keys.key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let _: () = redis::cmd("DECR")
        .arg(keys.fence())
        .query_async(&mut raw)
        .await
        .unwrap();
    let second = b
        .acquire("acct", LockOptions::new().wait(Duration::ZERO).fenced())
        .await
        .unwrap();
    let t2 = second.fencing_token().unwrap();
    assert_eq!(t2.get(), t.get(), "the same number, twice");
    assert_ne!(t2, t, "but another holder");
    assert_eq!(
        b.fenced_write("acct", t2, "new").await.unwrap(),
        FencedWrite::Written
    );
    assert!(matches!(
        a.fenced_write("acct", t, "stale").await.unwrap(),
        FencedWrite::Refused { .. }
    ));
    // The same holder may write again with its token.
    assert_eq!(
        b.fenced_write("acct", t2, "again").await.unwrap(),
        FencedWrite::Written
    );
    assert_eq!(
        b.fenced_read("acct").await.unwrap().as_deref(),
        Some(&b"again"[..])
    );
    drop(first);
    second.release().await.unwrap();
}

/// Case 6: a grant whose reply arrives after its lease (the request sat in a paused
/// server) is given back at once instead of blocking everyone for a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_with_no_validity_left_is_given_back_at_once() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    // Load the scripts first, so the queued call grants rather than gets NOSCRIPT.
    a.try_lock("warm").await.unwrap().release().await.unwrap();
    let key = a.keys("late").unwrap().key;
    server.pause();
    let attempt = {
        let a = a.clone();
        tokio::spawn(async move {
            a.acquire(
                "late",
                LockOptions::new()
                    .wait(Duration::ZERO)
                    .lease(Lease::Fixed(Duration::from_millis(300))),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.resume();
    let resumed = Instant::now();
    let outcome = attempt.await.unwrap();
    assert!(outcome.unwrap_err().is_busy(), "no usable grant");
    // Gone well before the 300 ms the server granted from its resumption.
    assert!(!exists(&server, &key).await);
    assert!(resumed.elapsed() < Duration::from_millis(250));
    let b = client(&server, LockConfig::new()).await;
    b.try_lock("late").await.unwrap().release().await.unwrap();
}

/// Case 7: a client shared by several runtimes (a global client in `#[tokio::test]`s)
/// keeps renewing and waking waiters after the runtime that started its tasks ended.
#[test]
fn a_client_outlives_the_runtime_that_first_used_it() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let (c, other) = rt1.block_on(async {
        let c = client(&server, config.clone()).await;
        let other = client(&server, config.clone()).await;
        // Starts the watchdog and the pub/sub tasks on rt1.
        let g = other.try_lock("w").await.unwrap();
        let waiter = c.acquire("w", LockOptions::new().wait(Duration::from_secs(5)));
        let (got, _) = tokio::join!(waiter, async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.release().await.unwrap();
        });
        got.unwrap().release().await.unwrap();
        (c, other)
    });
    drop(rt1);
    let rt2 = tokio::runtime::Runtime::new().unwrap();
    rt2.block_on(async {
        // The redis-rs connection's own driver task ended with rt1: the first call on
        // it may fail, and the connection manager reconnects on this runtime.
        for client in [&c, &other] {
            if let Err(e) = client.try_lock("reconnect").await {
                assert!(e.is_redis(), "{e}");
            }
        }
        let g = c.lock("renewed").await.unwrap();
        // Three leases: only renewals keep it.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_really_held(&server, &other, &g).await;
        g.release().await.unwrap();
        // Waiters subscribe again.
        let theirs = other.try_lock("w2").await.unwrap();
        let channel = c.keys("w2").unwrap().channel();
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move {
                c.acquire("w2", LockOptions::new().wait(Duration::from_secs(5)))
                    .await
            })
        };
        eventually(
            Duration::from_secs(2),
            "the waiter's subscription",
            || async { common::subscribers(&server, &channel).await == 1 },
        )
        .await;
        theirs.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    });
}

/// Case 7: many locks taken while the watchdog is busy renewing others are all renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_scheduled_during_a_renewal_pass_are_renewed() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(200));
    let a = client(&server, config).await;
    let b = client(&server, LockConfig::new()).await;
    let mut guards = Vec::new();
    let started = Instant::now();
    // Acquisitions spread over several renewal periods.
    while started.elapsed() < Duration::from_millis(400) {
        guards.push(a.try_lock(format!("many{}", guards.len())).await.unwrap());
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for g in &guards {
        assert_really_held(&server, &b, g).await;
    }
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    }
}
