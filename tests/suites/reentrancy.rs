//! Reentrancy through scopes, and exclusion between scopes.

mod common;

use std::time::Duration;

use common::{client, get};
use lock_core::{LockConfig, LockOptions, LockScope, Released};
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
