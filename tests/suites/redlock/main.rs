//! Redlock over 5 independent redis-server masters: mutual exclusion across processes
//! while masters die, the quorum error, a paused master, validity, lost quorum,
//! reentrancy and release results.

#[path = "../common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::eventually;
use lock_core::{Lease, LockConfig, LockOptions, LockScope, Redlock, Released};
use lock_tests::{RedisMasters, RedisServer};
use redis::AsyncCommands;

const NODES: usize = 5;

fn masters(n: usize) -> RedisMasters {
    RedisMasters::start(n)
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

fn config() -> LockConfig {
    LockConfig::new()
        .with_wait(Duration::from_secs(5))
        .with_command_timeout(Duration::from_secs(5))
}

async fn redlock(servers: &[RedisServer], node_timeout_ms: u64) -> Redlock {
    Redlock::open(urls(servers), config())
        .unwrap()
        .with_node_timeout(Duration::from_millis(node_timeout_ms))
        .unwrap()
}

/// Lock keys (not the per-slot fencing counters, nor waiter markers, which expire on
/// their own) left on a node.
async fn lock_hashes(server: &RedisServer) -> Vec<String> {
    let mut conn = server.connection().await;
    let keys: Vec<String> = conn.keys("lock:*").await.unwrap();
    keys.into_iter()
        .filter(|k| !k.starts_with("lock:fence:{") && !k.ends_with(":waiters"))
        .collect()
}

/// Two worker processes x 8 tasks count under a Redlock over 5 masters; 2 masters are
/// SIGKILLed mid-run. Every increment must survive; then a third master dies and
/// acquisition fails with the quorum error within the wait budget; after restarting
/// the three, no lock hash remains once the leases have passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_keep_mutual_exclusion_while_two_of_five_masters_die() {
    let data = RedisServer::start();
    let mut nodes = masters(NODES);
    let lock_urls = urls(&nodes).join(",");
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args([
                "redlock-count",
                &data.url(),
                &lock_urls,
                "8",
                "120",
                "3",
                "300",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn lock-worker")
    };
    let workers = [spawn(), spawn()];

    // Kill two masters once the run is well under way.
    let mut conn = data.connection().await;
    eventually(
        Duration::from_secs(60),
        "100 increments before the kill",
        || {
            let mut conn = conn.clone();
            async move {
                let mut total = 0u64;
                for k in 0..3 {
                    let v: Option<u64> = conn.get(format!("counter:{k}")).await.unwrap();
                    total += v.unwrap_or(0);
                }
                total >= 100
            }
        },
    )
    .await;
    nodes[1].kill();
    nodes[3].kill();
    let killed_at: u64 = {
        let mut total = 0;
        for k in 0..3 {
            let v: Option<u64> = conn.get(format!("counter:{k}")).await.unwrap();
            total += v.unwrap_or(0);
        }
        total
    };

    let mut acquired = [0u64; 3];
    for w in workers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output())
            .await
            .unwrap()
            .expect("worker output");
        assert!(out.status.success(), "worker failed: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("done "))
            .unwrap_or_else(|| panic!("no result line in {text:?}"));
        let (counts, failed) = line.split_once(" failed ").expect("failed count");
        assert_eq!(
            failed, "0",
            "with 3 of 5 masters up every acquisition must succeed"
        );
        for (k, n) in counts.split(' ').enumerate() {
            acquired[k] += n.parse::<u64>().unwrap();
        }
    }
    assert_eq!(acquired.iter().sum::<u64>(), 2 * 8 * 120);
    let mut counters = [0u64; 3];
    for (k, c) in counters.iter_mut().enumerate() {
        let v: Option<u64> = conn.get(format!("counter:{k}")).await.unwrap();
        *c = v.unwrap_or(0);
    }
    assert_eq!(
        counters, acquired,
        "a lost update means two holders overlapped"
    );
    assert!(
        killed_at < acquired.iter().sum::<u64>(),
        "the kill must happen mid-run (at {killed_at} increments)"
    );

    // A third master down: 2 of 5 left, below the quorum of 3.
    nodes[4].kill();
    let redlock = redlock(&nodes, 200).await;
    let wait = Duration::from_millis(800);
    let started = Instant::now();
    let err = redlock
        .acquire("quorum-gone", LockOptions::new().wait(wait))
        .await
        .expect_err("2 of 5 masters cannot grant");
    let took = started.elapsed();
    assert!(err.is_no_quorum(), "{err}");
    let text = err.to_string();
    assert!(text.contains("2 of 5 nodes agreed, 3 needed"), "{text}");
    assert!(
        took < wait + Duration::from_millis(1500),
        "the quorum error must come within the wait budget (+ one round): {took:?}"
    );
    // The two live masters gave their copies back after every failed round.
    for i in [0, 2] {
        assert_eq!(
            lock_hashes(&nodes[i]).await,
            Vec::<String>::new(),
            "node {i}"
        );
    }

    // Restart the three; whatever copies a worker left behind expire with their lease
    // (2 s watchdog lease in the workers).
    for i in [1, 3, 4] {
        nodes[i].restart();
    }
    for (i, node) in nodes.iter().enumerate() {
        eventually(
            Duration::from_secs(5),
            &format!("node {i} free of lock hashes"),
            || async { lock_hashes(node).await.is_empty() },
        )
        .await;
    }
    // And the Redlock works again with all five (each restarted node's connection is
    // re-established by the first call that finds it broken).
    eventually(
        Duration::from_secs(5),
        "a grant by all five masters",
        || async {
            match redlock.try_lock("quorum-gone").await {
                Ok(guard) => {
                    let copies = guard.copies();
                    assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
                    copies == NODES
                }
                // The first call to a restarted node still reports the old failure.
                Err(e) if e.is_no_quorum() => false,
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
}

/// A master frozen with SIGSTOP costs at most the per-node timeout, and the other four
/// still grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_costs_at_most_the_node_timeout() {
    let nodes = masters(NODES);
    let node_timeout = Duration::from_millis(150);
    let redlock = redlock(&nodes, node_timeout.as_millis() as u64).await;
    // Warm every connection first.
    redlock
        .try_lock("warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    nodes[2].pause();
    let started = Instant::now();
    let guard = redlock.try_lock("paused").await.expect("4 of 5 grant");
    let took = started.elapsed();
    assert_eq!(guard.granted_nodes(), vec![0, 1, 3, 4]);
    assert!(guard.is_held());
    // Bounded by the node timeout (150 ms), far below the 5 s command timeout.
    assert!(took < Duration::from_secs(1), "acquire took {took:?}");
    assert!(
        took >= node_timeout,
        "the paused node was waited for: {took:?}"
    );
    assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
    nodes[2].resume();

    // A node that holds a copy and freezes does not hold up the release: it answers
    // once a quorum agreed (the frozen copy runs out with its lease).
    let guard = redlock.try_lock("paused").await.unwrap();
    assert_eq!(guard.copies(), NODES);
    nodes[4].pause();
    let started = Instant::now();
    assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
    let took = started.elapsed();
    assert!(
        took < node_timeout,
        "release waited for the paused node: {took:?}"
    );
    nodes[4].resume();
}

/// Validity = lease - elapsed - drift: a slow node shortens it, and a grant that took
/// longer than the lease is refused and given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_node_shortens_validity_and_an_overlong_grant_is_refused() {
    let nodes = masters(NODES);
    let redlock = redlock(&nodes, 300).await;
    redlock
        .try_lock("warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    nodes[4].pause();

    let lease = Duration::from_millis(1000);
    let opts = || {
        LockOptions::new()
            .wait(Duration::ZERO)
            .lease(Lease::Fixed(lease))
    };
    let guard = redlock.acquire("short", opts()).await.unwrap();
    let valid = guard.valid_for();
    // 300 ms waited for the paused node, and 12 ms of drift allowance.
    assert!(
        valid <= lease - Duration::from_millis(300 + 12),
        "validity not shortened: {valid:?}"
    );
    assert!(valid > Duration::ZERO);
    guard.release().await.unwrap();

    // A 250 ms lease cannot survive waiting 300 ms for the paused node.
    let lease = Duration::from_millis(250);
    let err = redlock
        .acquire(
            "too-late",
            LockOptions::new()
                .wait(Duration::ZERO)
                .lease(Lease::Fixed(lease)),
        )
        .await
        .expect_err("a grant older than its lease");
    assert!(
        matches!(err, lock_core::LockError::ValidityExhausted { .. }),
        "{err}"
    );
    for (i, node) in nodes.iter().enumerate().take(4) {
        assert_eq!(
            lock_hashes(node).await,
            Vec::<String>::new(),
            "node {i} kept a copy"
        );
    }
    // The paused node never answered; once it runs again it executes the queued
    // acquisitions, and the undo requests queued behind them free the lock there too.
    nodes[4].resume();
    eventually(
        // Well inside the 1 s lease of the copy it granted on resuming.
        Duration::from_millis(500),
        "the node that did not answer to give its copies back",
        || async { lock_hashes(&nodes[4]).await.is_empty() },
    )
    .await;
}

/// The watchdog renews every copy; when three of five masters die, the renewals lose
/// the quorum and `lost()` fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_quorum_of_renewals_fires_lost() {
    let mut nodes = masters(NODES);
    let config = config()
        .with_watchdog_lease(Duration::from_millis(900))
        .with_command_timeout(Duration::from_millis(300));
    let redlock = Redlock::open(urls(&nodes), config).unwrap();
    let guard = redlock.try_lock("renewed").await.unwrap();
    // Held well past its lease thanks to the renewals.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(guard.is_held(), "renewed copies must keep the lock");
    assert_eq!(guard.copies(), NODES);

    nodes[0].kill();
    nodes[1].kill();
    // Two lost copies are tolerated.
    let lost = guard.lost();
    tokio::pin!(lost);
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), &mut lost)
            .await
            .is_err(),
        "two lost copies out of five must not fire lost()"
    );
    assert!(guard.is_held());
    nodes[2].kill();
    tokio::time::timeout(Duration::from_secs(3), &mut lost)
        .await
        .expect("lost() after the third master died");
    assert!(!guard.is_held());
    // No quorum answers the release either: a grant reported lost releases with its
    // loss (the release is sent again in the background).
    let err = guard.release().await.expect_err("no quorum to release");
    assert!(err.is_lost(), "{err}");
}

/// Reentrancy per scope, and the release results of a quorum.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentrant_holds_and_release_results() {
    let nodes = masters(NODES);
    let redlock = redlock(&nodes, 200).await;
    LockScope::new()
        .run(async {
            let outer = redlock.lock("account").await.unwrap();
            let inner = redlock.lock("account").await.unwrap();
            let key = &redlock.keys("account").unwrap()[0].key;
            for node in nodes.iter() {
                let mut conn = node.connection().await;
                let value: Option<String> = conn.get(key).await.unwrap();
                assert!(value.is_some(), "a copy of the grant on every node");
            }
            // Another scope cannot take it meanwhile.
            let other = LockScope::new()
                .run(async { redlock.try_lock("account").await })
                .await;
            assert!(other.unwrap_err().is_busy());
            assert_eq!(
                inner.release().await.unwrap(),
                Released::StillHeld { holds_left: 1 }
            );
            assert_eq!(outer.release().await.unwrap(), Released::Unlocked);
        })
        .await;
    for node in nodes.iter() {
        assert!(lock_hashes(node).await.is_empty());
    }

    // Fencing: only the designated node's token, and only when it granted.
    let guard = redlock.try_lock("fenced").await.unwrap();
    assert_eq!(guard.fencing_token(), None, "taken on demand");
    let token = guard.fence().await.unwrap();
    assert_eq!(guard.fencing_token(), Some(token));
    assert!(guard.fencing_token().is_some());
    guard.release().await.unwrap();
    nodes[0].pause();
    let guard = redlock.try_lock("fenced").await.unwrap();
    let err = guard.fence().await.expect_err("node 0 did not grant");
    assert!(
        matches!(err, lock_core::LockError::NoFencingToken { .. }),
        "{err}"
    );
    // The trait's answer for a grant without a token.
    assert_eq!(lock_core::HeldLock::fence(&guard).await.unwrap(), None);
    guard.release().await.unwrap();
    nodes[0].resume();
}

/// A dropped guard gives every copy back; a second Redlock (another "process") then
/// takes the lock at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_guard_releases_every_copy() {
    let nodes = masters(3);
    let a = redlock(&nodes, 200).await;
    let b = redlock(&nodes, 200).await;
    let guard = a.try_lock("job").await.unwrap();
    assert!(b.try_lock("job").await.unwrap_err().is_busy());
    drop(guard);
    let started = Instant::now();
    // The copies go back in the background: a quorum of them may be back before the
    // last one, so the lock is taken as soon as a quorum is free...
    let taken = b
        .acquire("job", LockOptions::new().wait(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(taken.copies() >= 2, "{} copies", taken.copies());
    taken.release().await.unwrap();
    // ...and every copy of the dropped guard was given back, none left to its lease.
    for node in nodes.iter() {
        eventually(Duration::from_secs(1), "every copy given back", || async {
            lock_hashes(node).await.is_empty()
        })
        .await;
    }
    let again = b.try_lock("job").await.unwrap();
    assert_eq!(again.copies(), 3);
    again.release().await.unwrap();
}

/// `extend` needs a quorum: it lengthens every copy while 3 of 5 answer, and fails with
/// the quorum error once only 2 do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_needs_a_quorum() {
    let mut nodes = masters(NODES);
    let redlock = redlock(&nodes, 200).await;
    let opts = LockOptions::new()
        .wait(Duration::ZERO)
        .lease(Lease::Fixed(Duration::from_millis(1000)));
    let guard = redlock.acquire("extended", opts).await.unwrap();
    assert!(guard.valid_for() <= Duration::from_millis(1000));
    nodes[0].kill();
    nodes[1].kill();
    guard
        .extend(Duration::from_secs(5))
        .await
        .expect("3 of 5 extend");
    assert!(
        guard.valid_for() > Duration::from_secs(4),
        "extended validity: {:?}",
        guard.valid_for()
    );
    let hash = &redlock.keys("extended").unwrap()[2].key;
    let mut conn = nodes[2].connection().await;
    let pttl: i64 = redis::cmd("PTTL")
        .arg(hash)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(pttl > 4000, "the copy on node 2 was extended: pttl {pttl}");

    nodes[2].kill();
    let err = guard
        .extend(Duration::from_secs(5))
        .await
        .expect_err("2 of 5 cannot extend");
    assert!(err.is_no_quorum(), "{err}");
    assert!(
        err.to_string().contains("2 of 5 nodes agreed, 3 needed"),
        "{err}"
    );
}

/// Each node keeps its own namespace: a Redlock whose nodes differ in namespace writes
/// each copy under its node's, excludes a second Redlock of the same layout, and gives
/// every copy back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_node_writes_its_copy_under_its_own_namespace() {
    let nodes = masters(3);
    let namespaces = ["app", "lock", "app"];
    let open = || async {
        let mut clients = Vec::new();
        for (server, ns) in nodes.iter().zip(namespaces) {
            let config = config().with_namespace(ns);
            clients.push(
                lock_core::LockClient::open_with_config(server.url().as_str(), config)
                    .await
                    .unwrap(),
            );
        }
        Redlock::new(clients).unwrap()
    };
    let (a, b) = (open().await, open().await);
    let guard = a.try_lock("job").await.unwrap();
    assert_eq!(guard.copies(), 3);
    for (server, ns) in nodes.iter().zip(namespaces) {
        let mut conn = server.connection().await;
        let keys: Vec<String> = conn.keys("*{job}").await.unwrap();
        assert_eq!(
            keys,
            [format!("{ns}:{{job}}")],
            "on the node of namespace {ns}"
        );
    }
    assert!(b.try_lock("job").await.unwrap_err().is_busy());
    assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
    for server in nodes.iter() {
        let mut conn = server.connection().await;
        let keys: Vec<String> = conn.keys("*{job}").await.unwrap();
        assert!(keys.is_empty(), "left behind: {keys:?}");
    }
    b.try_lock("job").await.unwrap().release().await.unwrap();
}

/// The first node's copy gone (deleted, or the node restarted without persistence)
/// while the others hold: no token orders this grant any more, but the lock itself
/// stands on the other copies, so it is neither lost nor released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_after_the_first_nodes_copy_went_is_refused_and_the_lock_stands() {
    let nodes = masters(3);
    let redlock = redlock(&nodes, 200).await;
    let opts = LockOptions::new()
        .wait(Duration::ZERO)
        .lease(Lease::Fixed(Duration::from_secs(30)));
    let guard = redlock.acquire("fenced", opts).await.unwrap();
    let first = &redlock.keys("fenced").unwrap()[0].key;
    let mut conn = nodes[0].connection().await;
    let _: i64 = conn.del(first).await.unwrap();
    let err = guard.fence().await.expect_err("the first node has no copy");
    assert!(
        matches!(err, lock_core::LockError::NoFencingToken { .. }),
        "{err}"
    );
    assert!(guard.is_held(), "the other copies hold the lock");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), guard.lost())
            .await
            .is_err(),
        "lost() fired though two of three copies hold"
    );
    assert!(redlock.try_lock("fenced").await.unwrap_err().is_busy());
    assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
}

/// One paused master among three: each renewal waits for it at most the node timeout,
/// so the two others' answers keep the lock, however long the command timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_costs_the_renewals_at_most_the_node_timeout() {
    let nodes = masters(3);
    let config = config().with_watchdog_lease(Duration::from_millis(1000));
    let redlock = Redlock::open(urls(&nodes), config)
        .unwrap()
        .with_node_timeout(Duration::from_millis(200))
        .unwrap();
    let guard = redlock.try_lock("renewed").await.unwrap();
    nodes[2].pause();
    let lost = tokio::time::timeout(Duration::from_millis(3000), guard.lost()).await;
    nodes[2].resume();
    assert!(
        lost.is_err(),
        "lost() fired with two of three masters answering"
    );
    assert!(guard.is_held());
    assert_eq!(guard.release().await.unwrap(), Released::Unlocked);
}
