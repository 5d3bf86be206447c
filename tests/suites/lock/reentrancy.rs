//! Reentrancy through scopes, and exclusion between scopes. A dropped, cancelled or
//! timed-out hold never frees the scope's next grant, and nested holds with different
//! leases never believe in more lease than the server has.

use crate::common;

use std::time::{Duration, Instant};

use common::{assert_really_held, client, get, pttl};
use lock_core::{Lease, LockConfig, LockOptions, LockScope, Released};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_acquisition_in_one_scope_reenters_and_other_scopes_block() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let hash = c.keys("account").unwrap().key;

    let (outer, inner) = LockScope::new()
        .run(async {
            let outer = c.lock("account").await.unwrap();
            let inner = tokio::time::timeout(Duration::from_secs(1), c.lock("account"))
                .await
                .expect("re-entry must not wait")
                .unwrap();
            (outer, inner)
        })
        .await;
    // One grant, one token, whichever hold takes it.
    let token = inner.fence().await.unwrap();
    assert_eq!(outer.fencing_token(), Some(token), "one token");
    assert_eq!(inner.owner(), outer.owner());
    assert_eq!(inner.grant_value(), outer.grant_value(), "one grant");
    assert_eq!(
        get(&server, &hash).await.as_deref(),
        Some(outer.grant_value())
    );

    // Another scope (another task) is shut out, and waits.
    let waiter = {
        let c = c.clone();
        tokio::spawn(async move { LockScope::new().run(c.lock("account")).await })
    };
    assert!(c.try_lock("account").await.unwrap_err().is_busy());

    assert_eq!(
        inner.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    );
    assert_eq!(
        get(&server, &hash).await.as_deref(),
        Some(outer.grant_value())
    );
    assert!(c.try_lock("account").await.unwrap_err().is_busy());
    assert!(!waiter.is_finished());

    let outer_token = outer.fence().await.unwrap();
    assert_eq!(outer.release().await.unwrap(), Released::Unlocked);
    let theirs = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("waiter gets the lock after the outer release")
        .unwrap()
        .unwrap();
    assert!(theirs.fence().await.unwrap() > outer_token);
    theirs.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_scope_and_reenter() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let scope = LockScope::new();
    let a = c
        .acquire("cart", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    let b = c
        .acquire(
            "cart",
            LockOptions::new().scope(&scope).wait(Duration::ZERO),
        )
        .await
        .unwrap();
    let d = a.reenter().await.unwrap();
    assert_eq!(d.fence().await.unwrap(), a.fence().await.unwrap());
    let hash = c.keys("cart").unwrap().key;
    assert_eq!(get(&server, &hash).await.as_deref(), Some(a.grant_value()));
    // Without a scope every acquisition is its own owner: not reentrant.
    assert!(c.try_lock("cart").await.unwrap_err().is_busy());
    drop(d);
    b.release().await.unwrap();
    assert_eq!(a.release().await.unwrap(), Released::Unlocked);
    c.try_lock("cart").await.unwrap().release().await.unwrap();
}

/// Re-entering and giving back an inner hold cost no round trip: only the first
/// acquisition and the last release reach Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_is_counted_in_the_client() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let mut monitor = server.monitor().await;
    LockScope::new()
        .run(async {
            let outer = c.try_lock("count").await.unwrap();
            let _ = monitor.lines_within(Duration::from_millis(100)).await;
            for _ in 0..5 {
                let inner = c.try_lock("count").await.unwrap();
                let again = inner.reenter().await.unwrap();
                assert_eq!(
                    again.release().await.unwrap(),
                    Released::StillHeld { holds_left: 2 }
                );
                drop(inner);
            }
            let quiet = monitor.lines_within(Duration::from_millis(100)).await;
            assert!(
                !quiet.iter().any(|l| l.contains("EVAL")),
                "re-entries reached Redis: {quiet:?}"
            );
            assert_eq!(outer.release().await.unwrap(), Released::Unlocked);
            let last = monitor.lines_within(Duration::from_millis(100)).await;
            assert!(
                last.iter().any(|l| l.contains("EVAL")),
                "the last release did not"
            );
        })
        .await;
    assert!(!common::exists(&server, &c.keys("count").unwrap().key).await);
}

/// Drop a guard and take the lock again at once in the same scope; the dropped
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

/// A cancelled or timed-out acquisition, then a retry in the
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

/// A nested hold with a longer lease, released first, must not leave the outer
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
