//! Pipelining: plain `SET NX PX` acquisitions that queue behind one in flight go to
//! Redis as one pipeline, each caller with its own reply or error; a caller that goes
//! away before the pipeline is sent sends nothing, one that goes away after leaves no
//! lock behind.

use crate::common;

use std::time::Duration;

use common::{
    client, eventually, exists, in_flight, load_scripts, one_in_flight, queue_behind_one, sets_of,
};
use lock_core::{LockClient, LockConfig, LockError, LockOptions};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pipeline_carries_each_callers_own_reply_and_error() {
    let server = RedisServer::start();
    // A user that may touch only keys with `ok` in their name (and the fencing
    // counters, which a busy lock's script call names): a SET on any other key is
    // refused (NOPERM) for that command alone.
    let mut raw = server.connection().await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "limited",
            "on",
            ">pw",
            "~*ok*",
            "~*:fence:*",
            "&*",
            "+@all",
        ])
        .query_async(&mut raw)
        .await
        .unwrap();
    let url = format!("redis://limited:pw@127.0.0.1:{}/", server.port());
    let c = LockClient::open_with_config(url.as_str(), one_in_flight())
        .await
        .unwrap();
    let other = client(&server, LockConfig::new()).await;
    let held = other.try_lock("held-ok").await.unwrap();
    c.try_lock("warm-ok")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    let mut monitor = server.monitor().await;
    server.pause();
    let names = ["ok-1", "held-ok", "forbidden", "ok-2", "ok-3"];
    let (first, queued) = queue_behind_one(&c, "first-ok", &names).await;
    server.resume();
    let first = first.await.unwrap().unwrap();
    let mut out = Vec::new();
    for q in queued {
        out.push(q.await.unwrap());
    }
    assert!(out[0].is_ok(), "{out:?}");
    assert!(
        matches!(out[1], Err(LockError::Busy { .. })),
        "{:?}",
        out[1]
    );
    assert!(
        matches!(&out[2], Err(LockError::Redis(e)) if e.code() == Some("NOPERM")),
        "the refused entry gets its own error: {:?}",
        out[2]
    );
    assert!(out[3].is_ok() && out[4].is_ok());
    // Each SET ran once, and the grants are the callers' own.
    let keys: Vec<String> = names.iter().map(|n| c.keys(*n).unwrap().key).collect();
    assert_eq!(
        sets_of(&server, &mut monitor, &keys).await,
        [1, 1, 0, 1, 1],
        "the refused SET never ran"
    );
    assert_eq!(c.held_count(), 4);
    for (i, g) in [(0, &out[0]), (3, &out[3]), (4, &out[4])] {
        let g = g.as_ref().unwrap();
        assert!(g.is_held());
        assert!(common::get(&server, &keys[i]).await.is_some());
    }
    for g in out.into_iter().flatten() {
        g.release().await.unwrap();
    }
    first.release().await.unwrap();
    assert!(held.is_held());
    assert!(!exists(&server, &keys[2]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquisition_dropped_before_sending_sends_nothing() {
    let server = RedisServer::start();
    let c = client(&server, one_in_flight()).await;
    c.try_lock("warm").await.unwrap().release().await.unwrap();
    let mut monitor = server.monitor().await;
    server.pause();
    let names = ["gone-1", "gone-2", "stays"];
    let (first, mut queued) = queue_behind_one(&c, "first", &names).await;
    let stays = queued.pop().unwrap();
    for q in &queued {
        q.abort();
    }
    for q in queued {
        assert!(q.await.unwrap_err().is_cancelled());
    }
    server.resume();
    first.await.unwrap().unwrap().release().await.unwrap();
    stays.await.unwrap().unwrap().release().await.unwrap();
    let keys: Vec<String> = names.iter().map(|n| c.keys(*n).unwrap().key).collect();
    assert_eq!(sets_of(&server, &mut monitor, &keys).await, [0, 0, 1]);
    assert_eq!(c.held_count(), 0);
    assert_eq!(c.queued_calls(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_acquisition_dropped_after_sending_leaves_no_lock() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let c = client(&server, one_in_flight().with_command_timeout(timeout)).await;
    c.try_lock("warm").await.unwrap().release().await.unwrap();
    let mut monitor = server.monitor().await;
    server.pause();
    // The first times out after 500 ms, and the pipeline of the others goes then; they
    // give up at 800 ms, with their SETs sent and the server still paused.
    let first = {
        let c = c.clone();
        in_flight(async move { c.try_lock("first").await }).await
    };
    let names = ["late-1", "late-2", "late-3"];
    let late: Vec<_> = names
        .iter()
        .map(|&name| {
            let c = c.clone();
            let give_up = Duration::from_millis(800);
            tokio::spawn(async move { tokio::time::timeout(give_up, c.try_lock(name)).await })
        })
        .collect();
    eventually(Duration::from_secs(5), "the others to queue", || async {
        c.queued_calls() == names.len()
    })
    .await;
    for l in late {
        assert!(l.await.unwrap().is_err(), "gave up before any reply");
    }
    // The connection's own response timeout or ours, whichever fires first.
    let first = first.await.unwrap();
    assert!(
        matches!(
            first,
            Err(LockError::RedisTimeout { .. } | LockError::Redis(_))
        ),
        "{first:?}"
    );
    // The server now grants what was sent: each grant is given back.
    server.resume();
    let keys: Vec<String> = names.iter().map(|n| c.keys(*n).unwrap().key).collect();
    for key in &keys {
        eventually(Duration::from_secs(5), "no lock left behind", || async {
            !exists(&server, key).await
        })
        .await;
    }
    assert_eq!(
        sets_of(&server, &mut monitor, &keys).await,
        [1, 1, 1],
        "the pipeline was sent before its callers went away"
    );
    assert_eq!(c.held_count(), 0);
}

/// Calls that queue while one is in flight go as soon as the tasks already running have
/// queued theirs, without waiting for its reply, up to the limit of batches in flight;
/// at the limit they wait for a free place. Every caller then gets its own lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_acquisitions_go_while_earlier_ones_are_in_flight_up_to_the_limit() {
    let server = RedisServer::start();
    for (limit, left_queued) in [(None, 0), (Some(2), 3)] {
        let config = limit.map_or(LockConfig::new(), |n| {
            LockConfig::new().with_batches_in_flight(n)
        });
        let c = client(&server, config).await;
        c.try_lock("warm").await.unwrap().release().await.unwrap();
        server.pause();
        let tag = limit.unwrap_or(0);
        let first = {
            let c = c.clone();
            in_flight(async move { c.try_lock(("first", tag)).await }).await
        };
        let start = |name: &'static str| {
            let c = c.clone();
            tokio::spawn(async move { c.try_lock((name, tag)).await })
        };
        // A second call queues (polled once), then goes as a batch of its own while the
        // first is still in flight.
        let second = {
            let c = c.clone();
            in_flight(async move { c.try_lock(("second", tag)).await }).await
        };
        eventually(Duration::from_secs(5), "the second batch to go", || async {
            c.queued_calls() == 0
        })
        .await;
        let rest: Vec<_> = ["a", "b", "c"].into_iter().map(start).collect();
        eventually(
            Duration::from_secs(5),
            "the rest to go or queue",
            || async { c.queued_calls() == left_queued },
        )
        .await;
        server.resume();
        for attempt in [first, second].into_iter().chain(rest) {
            let guard = attempt.await.unwrap().unwrap();
            guard.release().await.unwrap();
        }
        assert_eq!(c.queued_calls(), 0, "limit {limit:?}");
        assert_eq!(c.held_count(), 0, "limit {limit:?}");
    }
}

/// More calls than one batch carries, queued at once on each lane (plain `SET`s, and
/// fenced acquisitions through the acquire script), some of them dropped before
/// sending and some busy: each batch carries its share, each caller gets its own
/// outcome, each grant on the server is its caller's own, and a dropped caller sent
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_past_one_batch_split_into_batches_each_with_its_own_outcome() {
    const N: usize = 300;
    let server = RedisServer::start();
    let c = client(&server, one_in_flight()).await;
    let other = client(&server, LockConfig::new()).await;
    let fenced = || LockOptions::new().wait(Duration::ZERO).fenced();
    load_scripts(&c).await;
    let name = |lane: &str, i: usize| format!("{lane}-{i}");
    let mut held = Vec::new();
    for lane in ["plain", "fenced"] {
        for i in (0..N).filter(|i| i % 7 == 3) {
            held.push(other.try_lock(name(lane, i)).await.unwrap());
        }
    }
    let mut monitor = server.monitor().await;
    server.pause();
    let first_plain = {
        let c = c.clone();
        in_flight(async move { c.try_lock("first-plain").await }).await
    };
    let first_fenced = {
        let c = c.clone();
        in_flight(async move { c.acquire("first-fenced", fenced()).await }).await
    };
    let mut queued = Vec::new();
    for lane in ["plain", "fenced"] {
        for i in 0..N {
            let (c, name) = (c.clone(), name(lane, i));
            queued.push(tokio::spawn(async move {
                match lane {
                    "plain" => c.try_lock(name).await,
                    _ => c.acquire(name, fenced()).await,
                }
            }));
        }
    }
    eventually(Duration::from_secs(10), "every call to queue", || async {
        c.queued_calls() == 2 * N
    })
    .await;
    // None among about the first batch's 128 (so it is sent as split off, with no
    // caller left out), some among the second's, none among the last.
    let dropped = |i: usize| (140..250).contains(&i) && i % 11 == 5;
    for (k, q) in queued.iter().enumerate() {
        if dropped(k % N) {
            q.abort();
        }
    }
    server.resume();
    first_plain.await.unwrap().unwrap().release().await.unwrap();
    first_fenced
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut guards = Vec::new();
    for (k, q) in queued.into_iter().enumerate() {
        let (lane, i) = (if k < N { "plain" } else { "fenced" }, k % N);
        let key = c.keys(name(lane, i)).unwrap().key;
        match q.await {
            Err(e) => assert!(e.is_cancelled() && dropped(i), "{lane} {i}: {e}"),
            Ok(_) if dropped(i) => {}
            Ok(Err(LockError::Busy { .. })) if i % 7 == 3 => {}
            Ok(Ok(g)) if i % 7 != 3 => {
                assert_eq!(
                    common::get(&server, &key).await.as_deref(),
                    Some(g.grant_value()),
                    "{lane} {i}: the server holds another grant"
                );
                guards.push(g);
            }
            Ok(other) => panic!("{lane} {i}: {other:?}"),
        }
    }
    // A dropped caller's lock was never taken, and its SET never sent.
    let plain_keys: Vec<String> = (0..N)
        .map(|i| c.keys(name("plain", i)).unwrap().key)
        .collect();
    let sets = sets_of(&server, &mut monitor, &plain_keys).await;
    for i in 0..N {
        let key = c.keys(name("fenced", i)).unwrap().key;
        if dropped(i) {
            assert_eq!(sets[i], 0, "plain {i} was dropped before sending");
            if i % 7 != 3 {
                assert!(!exists(&server, &plain_keys[i]).await, "plain {i}");
                assert!(!exists(&server, &key).await, "fenced {i}");
            }
        } else {
            assert_eq!(sets[i], 1, "plain {i}: one SET");
        }
    }
    let expected = 2 * (0..N).filter(|&i| !dropped(i) && i % 7 != 3).count();
    assert_eq!(guards.len(), expected);
    for g in guards {
        assert_eq!(g.release().await.unwrap(), lock_core::Released::Unlocked);
    }
    drop(held);
}
