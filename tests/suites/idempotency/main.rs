//! The idempotency store and one-time tokens of lock-core on real Redis: begin /
//! complete / abandon transitions, leases, waiting, SCRIPT FLUSH, and tokens consumed
//! exactly once.

#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{
    Listener, client, client_commands_on, eventually, exists, get, set_by_hand, subscribers,
};
use lock_core::{Backoff, Begin, IdempotencyStore, LockConfig};
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
    // Long enough that a stall of this shared machine between two renewals (every
    // 200 ms) does not outlast the lease.
    let lease = Duration::from_millis(600);
    let c = claim(s.begin("long", "fp", lease).await.unwrap());
    // The work takes five leases; the key must stay claimed throughout.
    tokio::select! {
        _ = c.keep_alive() => panic!("keep_alive gave up while Redis was up"),
        _ = tokio::time::sleep(lease * 5) => {}
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
    let owner = client(&server, LockConfig::new()).await;
    let s = owner.idempotency_store("idem");
    // The waiter is another client (another process, as far as Redis can tell).
    let other = store(&server).await;
    for complete in [true, false] {
        let key = format!("wait-{complete}");
        let c = claim(s.begin(key.as_str(), "fp", LEASE).await.unwrap());
        let (record, channel) = (c.keys().record.clone(), c.keys().channel.clone());
        let mut listener = Listener::on(&server, &channel).await;
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
            || async { subscribers(&server, &channel).await >= 2 },
        )
        .await;
        // Subscribed, the waiter marks the record, so that its end is published; the
        // owner still renews it.
        eventually(
            Duration::from_secs(5),
            "the waiter to mark the record",
            || async {
                get(&server, &record)
                    .await
                    .is_some_and(|v| v.starts_with('W'))
            },
        )
        .await;
        c.extend().await.unwrap();
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
        // The message names the owner's client, whose own listener skips it.
        assert_eq!(
            listener.next_before_sentinel(&server).await,
            owner.id().to_hex(),
            "the message for a waited-for key (complete: {complete})"
        );
    }
    // A short wait ends in flight.
    let _held = claim(s.begin("busy", "fp", LEASE).await.unwrap());
    let found = other
        .begin_or_wait("busy", "fp", LEASE, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(matches!(found, Begin::InFlight { .. }), "{found:?}");
}

/// A record in flight without expiry (written by something other than this crate) has
/// no lease to wait for: a waiter backs off instead of asking every millisecond, and is
/// told to come back after the longest backoff step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_without_expiry_is_waited_for_with_backoff_not_polled() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let record = s.keys("by-hand").unwrap().record;
    set_by_hand(&server, &record, "Ffp another-program:1").await;
    let mut monitor = server.monitor().await;
    let found = s
        .begin_or_wait("by-hand", "fp", LEASE, Duration::from_millis(600))
        .await
        .unwrap();
    match found {
        Begin::InFlight { retry_after } => assert_eq!(retry_after, Backoff::default().max),
        other => panic!("expected in flight, got {other:?}"),
    }
    let asked = client_commands_on(&server, &mut monitor, &record).await;
    // Backoff from 20 ms doubling (full jitter) asks about ten times in 600 ms, two
    // commands each (19 seen); a waiter asking every millisecond sent over 400.
    assert!(
        asked < 60,
        "the waiter polled: {asked} commands on the record in 600 ms"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_nobody_waits_for_publishes_nothing() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let c = claim(s.begin("quiet", "fp", LEASE).await.unwrap());
    let channel = c.keys().channel.clone();
    let mut listener = Listener::on(&server, &channel).await;
    c.complete(b"done", DAY).await.unwrap();
    assert_eq!(
        listener.next_before_sentinel(&server).await,
        "sentinel",
        "a completion nobody waited for published"
    );
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

/// The claims (client `SET`s) on each of `records`, and the script calls, among what
/// `monitor` saw up to now.
async fn claims_sent(
    server: &RedisServer,
    monitor: &mut lock_tests::Monitor,
    records: &[&str],
) -> (Vec<usize>, usize) {
    let lines = common::seen_until_now(server, monitor).await;
    let scripts = lines
        .iter()
        .filter(|l| !l.contains(" lua] "))
        .filter(|l| l.contains("\"EVALSHA\"") || l.contains("\"EVAL\""))
        .count();
    (common::client_sets(&lines, records), scripts)
}

/// Starts `s.begin(key, fp)` in a task of its own.
fn begin_in_task(
    s: &IdempotencyStore,
    key: &'static str,
    fp: &'static str,
) -> tokio::task::JoinHandle<Result<Begin, lock_core::LockError>> {
    let s = s.clone();
    tokio::spawn(async move { s.begin(key, fp, LEASE).await })
}

/// Pauses `server` and leaves a claim of `first` (fingerprint `fp`) in flight on it:
/// claims started next queue behind it.
async fn first_on_paused_server(
    server: &RedisServer,
    s: &IdempotencyStore,
    fp: &'static str,
) -> tokio::task::JoinHandle<Result<Begin, lock_core::LockError>> {
    server.pause();
    let s = s.clone();
    common::in_flight(async move { s.begin("first", fp, LEASE).await }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_queued_behind_one_go_as_one_pipeline_each_with_its_own_answer() {
    let server = RedisServer::start();
    let c = client(&server, common::one_in_flight()).await;
    let s = c.idempotency_store("idem");
    let other = store(&server).await;
    claim(s.begin("done", "fp-a", LEASE).await.unwrap())
        .complete(b"stored", DAY)
        .await
        .unwrap();
    let busy = claim(other.begin("busy", "fp-a", LEASE).await.unwrap());
    let odd = s.keys("odd").unwrap().record;
    let mut raw = server.connection().await;
    let _: () = redis::cmd("HSET")
        .arg(&odd)
        .arg("f")
        .arg("v")
        .query_async(&mut raw)
        .await
        .unwrap();

    let mut monitor = server.monitor().await;
    let first = first_on_paused_server(&server, &s, "fp-a").await;
    let queued = vec![
        begin_in_task(&s, "new", "fp-a"),
        begin_in_task(&s, "done", "fp-a"),
        begin_in_task(&s, "done", "fp-b"),
        begin_in_task(&s, "busy", "fp-a"),
        begin_in_task(&s, "odd", "fp-a"),
    ];
    eventually(Duration::from_secs(5), "the claims to queue", || async {
        c.queued_calls() == queued.len()
    })
    .await;
    server.resume();
    let first = claim(first.await.unwrap().unwrap());
    let mut out = Vec::new();
    for q in queued {
        out.push(q.await.unwrap());
    }
    let new = match out.remove(0) {
        Ok(Begin::New(c)) => c,
        other => panic!("a free key is claimed: {other:?}"),
    };
    assert!(
        matches!(&out[0], Ok(Begin::Completed(r)) if r == b"stored"),
        "{:?}",
        out[0]
    );
    assert!(matches!(out[1], Ok(Begin::Mismatch)), "{:?}", out[1]);
    assert!(matches!(out[2], Ok(Begin::InFlight { .. })), "{:?}", out[2]);
    assert!(
        matches!(&out[3], Err(e) if e.is_redis() && e.to_string().contains("WRONGTYPE")),
        "the refused entry gets its own error: {:?}",
        out[3]
    );
    let records: Vec<String> = ["first", "new", "done", "busy", "odd"]
        .iter()
        .map(|k| s.keys(*k).unwrap().record)
        .collect();
    let records: Vec<&str> = records.iter().map(String::as_str).collect();
    // One claim alone, then one pipeline of five native claims: no script.
    assert_eq!(
        claims_sent(&server, &mut monitor, &records).await,
        (vec![1, 1, 2, 1, 1], 0)
    );
    first.abandon().await.unwrap();
    new.complete(b"ok", DAY).await.unwrap();
    busy.abandon().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_claim_dropped_before_sending_sends_nothing_and_after_frees_its_key() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let c = client(
        &server,
        common::one_in_flight().with_command_timeout(timeout),
    )
    .await;
    let s = c.idempotency_store("idem");
    claim(s.begin("warm", "fp", LEASE).await.unwrap())
        .abandon()
        .await
        .unwrap();
    let mut monitor = server.monitor().await;
    // The first times out after 500 ms and the pipeline of the others goes then; the
    // `late` ones give up at 800 ms, their claims sent and the server still paused.
    // The `gone` one is dropped before the pipeline is sent.
    let first = first_on_paused_server(&server, &s, "fp").await;
    let late: Vec<_> = ["late-1", "late-2"]
        .into_iter()
        .map(|key| {
            let s = s.clone();
            let give_up = Duration::from_millis(800);
            tokio::spawn(
                async move { tokio::time::timeout(give_up, s.begin(key, "fp", LEASE)).await },
            )
        })
        .collect();
    let gone = begin_in_task(&s, "gone", "fp");
    eventually(Duration::from_secs(5), "the claims to queue", || async {
        c.queued_calls() == 3
    })
    .await;
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    for l in late {
        assert!(l.await.unwrap().is_err(), "gave up before any reply");
    }
    assert!(first.await.unwrap().is_err(), "timed out");
    // The server now runs what was sent: every claim made is abandoned.
    server.resume();
    let records: Vec<String> = ["first", "late-1", "late-2", "gone"]
        .iter()
        .map(|k| s.keys(*k).unwrap().record)
        .collect();
    for record in &records {
        eventually(Duration::from_secs(5), "no claim left behind", || async {
            !exists(&server, record).await
        })
        .await;
    }
    let records: Vec<&str> = records.iter().map(String::as_str).collect();
    assert_eq!(
        claims_sent(&server, &mut monitor, &records).await.0,
        [1, 1, 1, 0],
        "the pipeline was sent before the late callers went away, and without the gone one"
    );
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
