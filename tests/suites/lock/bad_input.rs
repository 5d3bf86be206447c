//! Bad input gets a clear error, and hostile key parts cannot reach another lock.

use crate::common;

use std::time::Duration;

use common::client;
use lock_core::{Lease, LockClient, LockConfig, LockOptions, key::MAX_NAME_LEN};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_names_and_leases_are_refused_before_redis() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;

    let e = c.try_lock("").await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("empty"),
        "{e}"
    );
    let none: [&str; 0] = [];
    assert!(c.try_lock(none).await.unwrap_err().is_invalid_input());
    let long = "k".repeat(MAX_NAME_LEN + 1);
    let e = c.try_lock(long.as_str()).await.unwrap_err();
    assert!(e.to_string().contains("at most 1024"), "{e}");

    for lease in [Duration::ZERO, Duration::from_secs(365 * 24 * 3600)] {
        let e = c
            .acquire("x", LockOptions::new().lease(Lease::Fixed(lease)))
            .await
            .unwrap_err();
        assert!(
            e.is_invalid_input() && e.to_string().contains("lease"),
            "{e}"
        );
    }
    let g = c.try_lock("x").await.unwrap();
    let e = g.extend(Duration::ZERO).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    g.release().await.unwrap();

    let e = LockClient::open_with_config(
        server.url().as_str(),
        LockConfig::new().with_namespace("a{b}"),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("namespace"), "{e}");
    // A URL redis-rs cannot read is the caller's input: no retry mends it.
    for url in ["not a url", "redis://127.0.0.1:notaport/"] {
        let e = LockClient::open(url).await.unwrap_err();
        assert!(e.is_invalid_input() && !e.is_unavailable(), "{url}: {e}");
        let e = LockClient::open_cluster([url], LockConfig::new())
            .await
            .unwrap_err();
        assert!(e.is_invalid_input() && !e.is_unavailable(), "{url}: {e}");
    }
    // Nothing was written by the refused calls.
    let mut raw = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        keys.iter()
            .all(|k| k.starts_with("lock:{x}") || k.starts_with("lock:fence:{")),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_parts_do_not_collide() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let victim = c.try_lock(("user", "alice")).await.unwrap();
    let victim_keys = c.keys(("user", "alice")).unwrap();
    // Each of these would equal (or break into) the victim's keys without escaping.
    let attacks: Vec<Vec<String>> = vec![
        vec!["user:alice".into()],
        vec!["user".into(), "alice}".into()],
        vec!["user}:{alice".into()],
        vec!["user".into(), "alice}:fence".into()],
        vec!["user%3Aalice".into()],
        vec!["{user:alice}".into()],
    ];
    let mut guards = Vec::new();
    for parts in &attacks {
        let keys = c.keys(parts.as_slice()).unwrap();
        // (The fencing counter is per hash slot, shared by design; a name cannot
        // choose it beyond choosing its slot.)
        let victim = [
            victim_keys.key.clone(),
            victim_keys.waiters(),
            victim_keys.channel(),
        ];
        for k in [keys.key.clone(), keys.waiters(), keys.channel()] {
            assert!(!victim.contains(&k), "{parts:?} forged {k}");
            assert_eq!(k.matches('{').count(), 1, "{k}");
            assert_eq!(k.matches('}').count(), 1, "{k}");
        }
        // Free and distinct: each gets its own lock while the victim's is held.
        guards.push(c.try_lock(parts.as_slice()).await.unwrap());
    }
    assert!(victim.is_held());
    for g in guards {
        g.release().await.unwrap();
    }
    victim.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_waits_and_caps_do_not_overflow() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let opts = LockOptions::new()
        .wait(Duration::MAX)
        .max_hold(Duration::MAX);
    let g = c.acquire("forever", opts).await.unwrap();
    assert!(g.is_held());
    g.release().await.unwrap();
}

/// A key with no parts of its own is refused by the features that put their own name
/// first, as a lock name with no parts is: accepted, it would be one key shared by
/// every caller with an empty key (one rate bucket; one idempotency record, replayed
/// to unrelated requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_with_no_parts_of_its_own_is_refused_everywhere() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let none: Vec<String> = Vec::new();
    let e = c.keys(none.clone()).unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let e = c.idempotency_store("payments").keys(&none).unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let limiter = c.rate_limiter("login", lock_core::RateLimit::per_second(10));
    let e = limiter.check(none.clone()).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let e = c.semaphore(none, 3).unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
}
