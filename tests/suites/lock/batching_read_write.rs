//! Batching of read-write holds: acquisitions of read and write holds that queue behind
//! a call in flight share one call of `read_write.lua`, releases one of
//! `read_write_release.lua`, each caller still gets its own outcome, and a grant whose
//! caller left before the reply is given back.

use std::time::Duration;

use crate::batching::{in_one_batch, script_calls, sent_since};
use crate::common::{client, eventually, exists, get, in_flight, one_in_flight, script_sha};
use lock_core::{Lease, LockClient, LockConfig, LockError, LockOptions, Released};
use lock_tests::RedisServer;

fn read() -> LockOptions {
    LockOptions::new().read().wait(Duration::ZERO)
}

fn write() -> LockOptions {
    LockOptions::new().write().wait(Duration::ZERO)
}

/// `c.acquire(name, options)` in a task of its own.
fn take(c: &LockClient, name: &'static str, options: LockOptions) -> crate::common::Attempt {
    let c = c.clone();
    tokio::spawn(async move { c.acquire(name, options).await })
}

/// The hash key of the read-write lock `name` (taken once, which also loads the
/// script, and given back).
async fn hash_of(c: &LockClient, name: &str) -> String {
    let g = c.acquire(name, write()).await.unwrap();
    let key = g.keys().key.clone();
    g.release().await.unwrap();
    key
}

/// The fencing counter `fence`.
async fn fence_count(server: &RedisServer, fence: &str) -> u64 {
    get(server, fence).await.map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_carries_each_holds_own_outcome() {
    let server = RedisServer::start();
    let c = client(&server, one_in_flight()).await;
    let other = client(&server, LockConfig::new()).await;
    let _writer = other.acquire("written", write()).await.unwrap();
    let _reader = other.acquire("shared", read()).await.unwrap();
    let _another_reader = other.acquire("read", read()).await.unwrap();
    let brief = c
        .acquire(
            "brief",
            read().lease(Lease::Fixed(Duration::from_millis(100))),
        )
        .await
        .unwrap();

    let mut monitor = server.monitor().await;
    server.pause();
    let pending = vec![
        take(&c, "first", read()),
        take(&c, "shared", read()),
        take(&c, "solo", write()),
        take(&c, "written", read()),
        take(&c, "read", write()),
    ];
    let mut out = in_one_batch(&server, &c, pending).await.into_iter();
    let first = out.next().unwrap().unwrap();
    let shared = out.next().unwrap().unwrap();
    let solo = out.next().unwrap().unwrap();
    assert_eq!(first.fencing_token(), None, "a reader has no token");
    assert_eq!(shared.fencing_token(), None, "a reader has no token");
    assert!(solo.fencing_token().is_some(), "a writer has its token");
    for (what, busy) in [
        ("a reader beside another's writer", out.next().unwrap()),
        ("a writer beside another's reader", out.next().unwrap()),
    ] {
        assert!(
            matches!(busy, Err(LockError::Busy { .. })),
            "{what}: {busy:?}"
        );
    }
    let sent = sent_since(&server, &mut monitor).await;
    assert_eq!(
        (sent.get("EVALSHA read_write.lua"), script_calls(&sent)),
        (Some(&2), 2),
        "one acquisition alone, then one batch of four: {sent:?}"
    );

    // Releases: three held, one whose lease ran out, and one whose hash became a
    // string (its entry fails alone).
    let odd = c.acquire("odd", read()).await.unwrap();
    let mut raw = server.connection().await;
    let _: () = redis::cmd("SET")
        .arg(&odd.keys().key)
        .arg("x")
        .query_async(&mut raw)
        .await
        .unwrap();
    eventually(Duration::from_secs(2), "the brief lease to end", || async {
        !brief.is_held()
    })
    .await;
    // The release script's first call loads it (NOSCRIPT, then EVAL): not counted.
    let warm = c.acquire("warm", read()).await.unwrap();
    warm.release().await.unwrap();
    let _ = sent_since(&server, &mut monitor).await;
    server.pause();
    let pending = vec![
        tokio::spawn(first.release()),
        tokio::spawn(shared.release()),
        tokio::spawn(solo.release()),
        tokio::spawn(brief.release()),
        tokio::spawn(odd.release()),
    ];
    let out = in_one_batch(&server, &c, pending).await;
    for released in &out[..3] {
        assert!(matches!(released, Ok(Released::Unlocked)), "{released:?}");
    }
    assert!(
        matches!(out[3], Err(LockError::Expired { .. })),
        "{:?}",
        out[3]
    );
    let sent = sent_since(&server, &mut monitor).await;
    assert_eq!(
        (
            sent.get("EVALSHA read_write_release.lua"),
            script_calls(&sent)
        ),
        (Some(&2), 2),
        "one release alone, then one batch of four: {sent:?}"
    );
    // Each release took effect: another owner writes where they held.
    for name in ["first", "solo"] {
        let g = other.acquire(name, write()).await.unwrap();
        g.release().await.unwrap();
    }
    assert_eq!(c.held_count(), 0);
}

/// Acquisitions whose batch was sent, but whose callers left before the reply (the
/// server paused), are given back once it comes: no hold is left for its lease, and
/// the writer's fencing counter shows it really was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_granted_after_their_callers_left_are_given_back() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let c = client(&server, one_in_flight().with_command_timeout(timeout)).await;
    let hashes = [hash_of(&c, "late-r").await, hash_of(&c, "late-w").await];
    let fence = c.keys("late-w").unwrap().fence();
    let before = fence_count(&server, &fence).await;
    server.pause();
    // The first times out after 500 ms and the batch of the others goes then; they give
    // up at 800 ms, with their calls sent and the server still paused.
    let first = {
        let c = c.clone();
        in_flight(async move { c.acquire("first", read()).await }).await
    };
    let late: Vec<_> = [("late-r", read()), ("late-w", write())]
        .into_iter()
        .map(|(name, options)| {
            let c = c.clone();
            let give_up = Duration::from_millis(800);
            tokio::spawn(
                async move { tokio::time::timeout(give_up, c.acquire(name, options)).await },
            )
        })
        .collect();
    eventually(Duration::from_secs(5), "the others to queue", || async {
        c.queued_calls() == 2
    })
    .await;
    for l in late {
        assert!(l.await.unwrap().is_err(), "gave up before any reply");
    }
    assert!(first.await.unwrap().is_err(), "the first timed out");
    server.resume();
    for hash in &hashes {
        eventually(Duration::from_secs(5), "no hold left behind", || async {
            !exists(&server, hash).await
        })
        .await;
    }
    assert_eq!(
        fence_count(&server, &fence).await,
        before + 1,
        "the writer was granted, then given back"
    );
    assert_eq!(c.held_count(), 0);
}

/// Watched holds renewed in one pass (a plain lock beside them) are extended by one
/// call of the script, one entry each, and stay held past several leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_holds_are_extended_together() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let c = client(&server, LockConfig::new().with_watchdog_lease(lease)).await;
    let other = client(&server, LockConfig::new()).await;
    let watched =
        |mode: fn() -> LockOptions| mode().lease(Lease::Watchdog).wait(Duration::from_secs(1));
    let mut monitor = server.monitor().await;
    // Taken together, so every renewal pass carries all of them.
    let (r1, r2, w, plain) = tokio::join!(
        c.acquire("r1", watched(read)),
        c.acquire("r2", watched(read)),
        c.acquire("w", watched(write)),
        c.try_lock("plain"),
    );
    let guards = [r1.unwrap(), r2.unwrap(), w.unwrap(), plain.unwrap()];
    let extensions = format!("\"EVALSHA\" \"{}\"", script_sha("read_write_extend.lua"));
    // Three passes of renewals.
    let mut calls = Vec::new();
    for _ in 0..3 {
        let lines = monitor
            .wait_for(&extensions, Duration::from_secs(10))
            .await
            .expect("a renewal pass");
        calls.extend(lines.last().cloned());
    }
    for call in &calls {
        // After the script's hash: its number of keys, one per hold.
        let numkeys = call
            .split(extensions.as_str())
            .nth(1)
            .and_then(|r| r.split('"').nth(1));
        assert_eq!(numkeys, Some("3"), "{call}");
    }
    for g in &guards {
        assert!(g.is_held(), "{} was lost", g.name());
    }
    for name in ["r1", "w"] {
        let e = other.acquire(name, write()).await.unwrap_err();
        assert!(e.is_busy(), "{name}: {e}");
    }
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    }
}
