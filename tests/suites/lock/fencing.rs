//! Fencing tokens on demand: an uncontended cycle is the raw recipe (`SET NX PX`, then
//! the compare-and-delete script); a token is taken when asked for, only while the
//! grant still holds the lock, and grows across holders either way. An equal token from
//! another holder is refused, and the counters stay bounded (one per hash slot) however
//! many names were locked.

use crate::common;

use std::time::Duration;

use common::client;
use lock_core::{FencedWrite, Lease, LockConfig, LockOptions};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_lock_is_a_plain_set_and_a_fenced_one_a_script() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    // Load the scripts first so that what follows is one call each.
    c.acquire("warm", LockOptions::new().fenced())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut monitor = server.monitor().await;
    let g = c.try_lock("plain").await.unwrap();
    let acquired = monitor.lines_within(Duration::from_millis(100)).await;
    assert!(
        acquired
            .iter()
            .any(|l| l.contains("\"SET\"") && l.contains("\"NX\"")),
        "no SET NX: {acquired:?}"
    );
    assert!(
        !acquired.iter().any(|l| l.contains("EVAL")),
        "an unfenced uncontended acquire ran a script: {acquired:?}"
    );
    assert_eq!(g.fencing_token(), None);
    g.release().await.unwrap();
    let _ = monitor.lines_within(Duration::from_millis(100)).await;
    let f = c
        .acquire("fenced", LockOptions::new().fenced())
        .await
        .unwrap();
    let acquired = monitor.lines_within(Duration::from_millis(100)).await;
    assert!(
        acquired.iter().any(|l| l.contains("EVALSHA")),
        "a fenced acquire takes its token in the script: {acquired:?}"
    );
    assert!(f.fencing_token().is_some());
    f.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_taken_on_demand_grow_across_holders_and_are_kept() {
    let server = RedisServer::start();
    let (a, b) = (
        client(&server, LockConfig::new()).await,
        client(&server, LockConfig::new()).await,
    );
    let mut last = None;
    for round in 0..6 {
        let c = if round % 2 == 0 { &a } else { &b };
        // Alternate: on demand, fenced at acquisition.
        let opts = if round % 3 == 0 {
            LockOptions::new().fenced()
        } else {
            LockOptions::new()
        };
        let g = c.acquire("ledger", opts).await.unwrap();
        let t = g.fence().await.unwrap();
        assert_eq!(g.fence().await.unwrap(), t, "kept, not taken twice");
        assert_eq!(g.fencing_token(), Some(t));
        if let Some(prev) = last {
            assert!(t > prev, "round {round}: {t} after {prev}");
        }
        last = Some(t);
        g.release().await.unwrap();
    }
}

/// A grant whose lease ran out, another holder having taken over, gets no token:
/// `fence()` fails with the loss and fires `lost()`, also when the grant took its token
/// with it (`fenced`) and the token it cached would be at hand.
async fn a_lost_grant_gets_no_token(fenced: bool, write: bool) {
    let server = RedisServer::start();
    let (a, b) = (
        client(&server, LockConfig::new()).await,
        client(&server, LockConfig::new()).await,
    );
    let mut short = LockOptions::new().lease(Lease::Fixed(Duration::from_millis(100)));
    if fenced {
        short = short.fenced();
    }
    if write {
        short = short.write();
    }
    let stale = a.acquire("job", short.clone()).await.unwrap();
    // A write hold's token comes with its grant.
    assert_eq!(stale.fencing_token().is_some(), fenced || write);
    let next = b
        .acquire("job", short.wait(Duration::from_secs(2)))
        .await
        .unwrap();
    let err = stale.fence().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(!stale.is_held());
    tokio::time::timeout(Duration::from_secs(1), stale.lost())
        .await
        .expect("the refused token reports the loss");
    assert!(next.fence().await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_gets_no_token_on_demand() {
    a_lost_grant_gets_no_token(false, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_fenced_grant_hands_out_no_cached_token() {
    a_lost_grant_gets_no_token(true, false).await;
}

/// A write hold's key is the read-write lock's hash, which the next writer holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_write_hold_hands_out_no_cached_token() {
    a_lost_grant_gets_no_token(false, true).await;
}

/// Keys in the server's database.
async fn dbsize(server: &RedisServer) -> i64 {
    let mut c = server.connection().await;
    redis::cmd("DBSIZE").query_async(&mut c).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_value_that_is_not_exactly_one_argument_is_refused_before_any_write() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let g = c
        .acquire("writer", LockOptions::new().fenced())
        .await
        .unwrap();
    let token = g.fencing_token().unwrap();
    let before = dbsize(&server).await;
    let none: Vec<String> = Vec::new();
    let e = c.fenced_write("ledger", token, none).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let e = c
        .fenced_write("ledger", token, vec!["a", "b"])
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(
        dbsize(&server).await,
        before,
        "a refused fenced write left a token or a value behind"
    );
    // The token was not used up: the same holder writes with it.
    assert_eq!(
        c.fenced_write("ledger", token, "ok").await.unwrap(),
        lock_core::FencedWrite::Written
    );
    g.release().await.unwrap();
}

/// Memory is bounded by what is held: 100 000 distinct names locked and
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

/// After a failover the promoted replica may hand out the same token again;
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
