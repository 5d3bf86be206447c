//! The idempotency store and one-time tokens of lock-core on real Redis: begin /
//! complete / abandon transitions, leases, waiting, SCRIPT FLUSH, and tokens consumed
//! exactly once.

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{client, eventually, exists, subscribers};
use lock_core::{Begin, IdempotencyStore, LockConfig};
use lock_tests::RedisServer;

const LEASE: Duration = Duration::from_secs(10);
const DAY: Duration = Duration::from_secs(24 * 3600);

async fn store(server: &RedisServer) -> IdempotencyStore {
    client(server, LockConfig::new())
        .await
        .idempotency_store("idem")
}

fn claim(b: Begin) -> lock_core::Claim {
    match b {
        Begin::New(c) => c,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn begin_complete_replay_mismatch_and_abandon() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let c = claim(s.begin(("u1", "k"), "fp-a", LEASE).await.unwrap());
    assert_eq!(c.key(), "idem:u1:k");
    assert!(exists(&server, &c.keys().record).await);
    match s.begin(("u1", "k"), "fp-a", LEASE).await.unwrap() {
        Begin::InFlight { retry_after } => assert!(retry_after <= LEASE),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.begin(("u1", "k"), "fp-b", LEASE).await.unwrap(),
        Begin::Mismatch
    ));
    // Another scope is another key.
    let other = claim(s.begin(("u2", "k"), "fp-a", LEASE).await.unwrap());
    let record = b"\x00binary\xffresponse".to_vec();
    c.complete(&record, DAY).await.unwrap();
    match s.begin(("u1", "k"), "fp-a", LEASE).await.unwrap() {
        Begin::Completed(stored) => assert_eq!(stored, record),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.begin(("u1", "k"), "fp-b", LEASE).await.unwrap(),
        Begin::Mismatch
    ));
    // Abandoned: the next request runs again.
    let keys = other.keys().clone();
    other.abandon().await.unwrap();
    assert!(!exists(&server, &keys.record).await);
    let again = claim(s.begin(("u2", "k"), "fp-a", LEASE).await.unwrap());
    again.abandon().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_claim_cannot_touch_the_next_one() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let short = Duration::from_millis(100);
    let stale = claim(s.begin("k", "fp", short).await.unwrap());
    // Nothing renews it: the key frees itself after the lease (a crashed server).
    let deadline = Instant::now() + Duration::from_secs(5);
    let fresh = loop {
        if let Begin::New(c) = s.begin("k", "fp", LEASE).await.unwrap() {
            break c;
        }
        assert!(Instant::now() < deadline, "the lease never freed the key");
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let e = stale.complete(b"late", DAY).await.unwrap_err();
    assert!(e.is_not_owner(), "{e}");
    assert!(matches!(
        s.begin("k", "fp", LEASE).await.unwrap(),
        Begin::InFlight { .. }
    ));
    fresh.complete(b"on time", DAY).await.unwrap();
    // Expired, with nobody holding the key.
    let gone = claim(s.begin("k2", "fp", short).await.unwrap());
    let record = gone.keys().record.clone();
    eventually(Duration::from_secs(5), "the record to expire", || async {
        !exists(&server, &record).await
    })
    .await;
    assert!(gone.extend().await.unwrap_err().is_expired());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_renews_past_many_leases_and_a_dropped_claim_frees_the_key() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let lease = Duration::from_millis(150);
    let c = claim(s.begin("long", "fp", lease).await.unwrap());
    // The work takes six leases; the key must stay claimed throughout.
    tokio::select! {
        _ = c.keep_alive() => panic!("keep_alive gave up while Redis was up"),
        _ = tokio::time::sleep(lease * 6) => {}
    }
    assert!(matches!(
        s.begin("long", "fp", lease).await.unwrap(),
        Begin::InFlight { .. }
    ));
    drop(c);
    // Dropped long before its lease ends: abandoned at once, not left to expire.
    let c = claim(s.begin("dropped", "fp", LEASE).await.unwrap());
    let record = c.keys().record.clone();
    drop(c);
    eventually(
        Duration::from_secs(5),
        "the dropped claim to be abandoned",
        || async { !exists(&server, &record).await },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_replay_on_completion_and_claim_on_abandon() {
    let server = RedisServer::start();
    let s = store(&server).await;
    // The waiter is another client (another process, as far as Redis can tell).
    let other = store(&server).await;
    for complete in [true, false] {
        let key = format!("wait-{complete}");
        let c = claim(s.begin(key.as_str(), "fp", LEASE).await.unwrap());
        let channel = c.keys().channel.clone();
        let waiter = {
            let (other, key) = (other.clone(), key.clone());
            tokio::spawn(async move {
                other
                    .begin_or_wait(key.as_str(), "fp", LEASE, Duration::from_secs(10))
                    .await
                    .unwrap()
            })
        };
        eventually(
            Duration::from_secs(5),
            "the waiter to subscribe",
            || async { subscribers(&server, &channel).await >= 1 },
        )
        .await;
        if complete {
            c.complete(b"done", DAY).await.unwrap();
            match waiter.await.unwrap() {
                Begin::Completed(r) => assert_eq!(r, b"done"),
                other => panic!("{other:?}"),
            }
        } else {
            c.abandon().await.unwrap();
            claim(waiter.await.unwrap()).abandon().await.unwrap();
        }
    }
    // A short wait ends in flight.
    let _held = claim(s.begin("busy", "fp", LEASE).await.unwrap());
    let found = other
        .begin_or_wait("busy", "fp", LEASE, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(matches!(found, Begin::InFlight { .. }), "{found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_and_redis_down_are_errors() {
    let mut server = RedisServer::start();
    let config = LockConfig::new().with_command_timeout(Duration::from_millis(300));
    let s = client(&server, config).await.idempotency_store("idem");
    let e = s.begin("k", "fp", Duration::ZERO).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let e = s.begin("", "fp", LEASE).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let c = claim(s.begin("k", "fp", LEASE).await.unwrap());
    let record = c.keys().record.clone();
    // A retention out of range is refused (under 1 ms too: the store keeps whole
    // milliseconds, and `PX 0` is no retention), and the claim frees the key.
    assert!(
        c.complete(b"r", Duration::ZERO)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    let c = claim(s.begin("sub-ms", "fp", LEASE).await.unwrap());
    let e = c
        .complete(b"r", Duration::from_micros(999))
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    eventually(
        Duration::from_secs(5),
        "the refused claim to free the key",
        || async { !exists(&server, &record).await },
    )
    .await;
    server.kill();
    let e = s.begin("k", "fp", LEASE).await.unwrap_err();
    assert!(e.is_redis(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_idempotency_script_survives_script_flush() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let flush = || async {
        let mut c = server.connection().await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .unwrap();
    };
    flush().await;
    let c = claim(s.begin("f", "fp", LEASE).await.unwrap()); // a plain SET NX GET
    flush().await;
    c.extend().await.unwrap(); // extend
    flush().await;
    c.complete(b"ok", DAY).await.unwrap(); // complete
    let c = claim(s.begin("g", "fp", LEASE).await.unwrap());
    flush().await;
    c.abandon().await.unwrap(); // abandon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_time_tokens_are_consumed_exactly_once() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let tokens = c.one_time_tokens("forms");
    let token = tokens
        .issue(("checkout", 7_u64), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(token.len(), 32);
    // Another scope cannot use it; neither can garbage.
    assert!(!tokens.consume(("checkout", 8_u64), &token).await.unwrap());
    for bad in ["", "x", "{}", &token.to_uppercase(), &"a".repeat(2000)] {
        assert!(
            !tokens.consume(("checkout", 7_u64), bad).await.unwrap(),
            "{bad:?}"
        );
    }
    let consumers: Vec<_> = (0..50)
        .map(|_| {
            let (tokens, token) = (tokens.clone(), token.clone());
            tokio::spawn(async move { tokens.consume(("checkout", 7_u64), &token).await })
        })
        .collect();
    let mut winners = 0;
    for c in consumers {
        winners += usize::from(c.await.unwrap().unwrap());
    }
    assert_eq!(winners, 1, "exactly one consumer may use the token");
    // Tokens expire.
    let short = tokens.issue("s", Duration::from_millis(20)).await.unwrap();
    let conn = server.connection().await;
    eventually(Duration::from_secs(5), "the token to expire", || {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*:token")
                .query_async(&mut conn)
                .await
                .unwrap();
            keys.is_empty()
        }
    })
    .await;
    assert!(!tokens.consume("s", &short).await.unwrap());
}
