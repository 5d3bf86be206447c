//! Reentrancy through scopes, and exclusion between scopes.

mod common;

use std::time::Duration;

use common::client;
use lock_core::{LockConfig, LockOptions, LockScope, Released};
use lock_tests::RedisServer;

async fn hold_count(server: &RedisServer, hash: &str, owner: &str) -> Option<i64> {
    let mut c = server.connection().await;
    redis::cmd("HGET")
        .arg(hash)
        .arg(owner)
        .query_async(&mut c)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_acquisition_in_one_scope_reenters_and_other_scopes_block() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let hash = c.keys("account").unwrap().hash;

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
    assert_eq!(inner.fencing_token(), outer.fencing_token(), "one token");
    assert_eq!(inner.owner(), outer.owner());
    assert_eq!(hold_count(&server, &hash, outer.owner()).await, Some(2));

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
    assert_eq!(hold_count(&server, &hash, outer.owner()).await, Some(1));
    assert!(c.try_lock("account").await.unwrap_err().is_busy());
    assert!(!waiter.is_finished());

    let outer_token = outer.fencing_token();
    assert_eq!(outer.release().await.unwrap(), Released::Unlocked);
    let theirs = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("waiter gets the lock after the outer release")
        .unwrap()
        .unwrap();
    assert!(theirs.fencing_token() > outer_token);
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
    assert_eq!(d.fencing_token(), a.fencing_token());
    let hash = c.keys("cart").unwrap().hash;
    assert_eq!(hold_count(&server, &hash, a.owner()).await, Some(3));
    // Without a scope every acquisition is its own owner: not reentrant.
    assert!(c.try_lock("cart").await.unwrap_err().is_busy());
    drop(d);
    b.release().await.unwrap();
    assert_eq!(a.release().await.unwrap(), Released::Unlocked);
    c.try_lock("cart").await.unwrap().release().await.unwrap();
}

/// The last local guard frees the lock even if an acquisition's reply was lost, so the
/// Redis hold count can never strand the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_guard_frees_the_lock_whatever_the_count() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let g = c.try_lock("count").await.unwrap();
    let hash = c.keys("count").unwrap().hash;
    let mut raw = server.connection().await;
    let _: i64 = redis::cmd("HINCRBY")
        .arg(&hash)
        .arg(g.owner())
        .arg(5)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    assert!(!common::exists(&server, &hash).await);
}
