//! `LockClient` on a real 3-master Redis Cluster (with replicas): mutual exclusion
//! across processes with locks on every master and a failover mid-run, waiters woken
//! across nodes, watchdog renewals batched per slot, and a lock lost in a failover
//! reported through `lost()`.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, eventually};
use lock_core::{LockClient, LockConfig, LockOptions};
use lock_tests::{FailoverMode, RedisCluster};
use redis::AsyncCommands;

pub(crate) fn config() -> LockConfig {
    LockConfig::new()
        .with_wait(Duration::from_secs(10))
        .with_command_timeout(Duration::from_secs(2))
}

pub(crate) async fn client(cluster: &RedisCluster, config: LockConfig) -> LockClient {
    LockClient::open_cluster(cluster.master_urls(), config)
        .await
        .expect("cluster client")
}

const KEYS: usize = 6;

/// Two worker processes x 8 tasks count under cluster locks whose keys live on all
/// three masters; one master is failed over (CLUSTER FAILOVER on its replica) while
/// they run. The clients keep working, and every increment survives unless a lost
/// lock was reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_keep_mutual_exclusion_through_a_failover() {
    let cluster = RedisCluster::start(3, 1);
    let probe = client(&cluster, config()).await;
    let masters: BTreeSet<usize> = (0..KEYS)
        .map(|k| cluster.master_for_key(probe.keys(("counter", k)).unwrap().key))
        .collect();
    assert_eq!(
        masters.len(),
        3,
        "the lock keys must be spread over all masters"
    );

    let seeds = cluster.master_urls().join(",");
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args([
                "cluster-count",
                &seeds,
                "8",
                "150",
                &KEYS.to_string(),
                "300",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn lock-worker")
    };
    let workers = [spawn(), spawn()];

    let mut data = cluster.connection().await;
    let total = |mut conn: redis::cluster_async::ClusterConnection| async move {
        let mut total = 0u64;
        for k in 0..KEYS {
            let v: Option<u64> = conn.get(format!("counter:{k}")).await.unwrap_or(None);
            total += v.unwrap_or(0);
        }
        total
    };
    eventually(
        Duration::from_secs(60),
        "200 increments before the failover",
        || {
            let f = total(data.clone());
            async move { f.await >= 200 }
        },
    )
    .await;
    // Fail over the master of lock key 0.
    let master = cluster.master_for_key(probe.keys(("counter", 0)).unwrap().key);
    let replica = cluster.replica_of(master);
    let before = total(data.clone()).await;
    cluster.failover(replica, FailoverMode::Coordinated);
    assert_eq!(
        cluster.master_for_key(probe.keys(("counter", 0)).unwrap().key),
        replica
    );

    let mut acquired = vec![0u64; KEYS];
    let mut lost = 0u64;
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
        let (counts, rest) = line.split_once(" lost ").expect("lost count");
        let (l, _errors) = rest.split_once(" errors ").expect("error count");
        lost += l.parse::<u64>().unwrap();
        for (k, n) in counts.split(' ').enumerate() {
            acquired[k] += n.parse::<u64>().unwrap();
        }
    }
    let sum: u64 = acquired.iter().sum();
    assert_eq!(sum, 2 * 8 * 150);
    assert!(
        before < sum,
        "the failover must happen mid-run ({before} of {sum})"
    );
    let mut counters = vec![0u64; KEYS];
    for (k, c) in counters.iter_mut().enumerate() {
        let v: Option<u64> = data.get(format!("counter:{k}")).await.unwrap();
        *c = v.unwrap_or(0);
    }
    // A coordinated failover loses no write, so no lock should be lost; if one was, it
    // must have been reported, and only then may an update be missing.
    let missing: u64 = acquired
        .iter()
        .zip(&counters)
        .map(|(a, c)| a.saturating_sub(*c))
        .sum();
    assert!(
        missing <= lost,
        "{missing} lost updates but only {lost} lost locks reported: {counters:?} vs {acquired:?}"
    );
    assert_eq!(lost, 0, "a coordinated failover must not lose a lock");
}

/// A waiter on one client is woken by a release made through another, on a lock that
/// lives on some master: the release message crosses the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_another_client() {
    let cluster = RedisCluster::start(3, 0);
    let a = client(&cluster, config()).await;
    let b = client(&cluster, config()).await;
    for name in ["wake-a", "wake-b", "wake-c"] {
        let guard = a.try_lock(name).await.unwrap();
        let waiter = {
            let b = b.clone();
            tokio::spawn(async move {
                let g = b.lock(name).await.unwrap();
                let at = Instant::now();
                g.release().await.unwrap();
                at
            })
        };
        // Long enough for the waiter's backoff to grow towards its 1 s maximum.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let granted = waiter.await.unwrap();
        let handoff = granted.saturating_duration_since(released);
        assert!(
            handoff < Duration::from_millis(150),
            "waiter of {name} woken {handoff:?} after the release: no pub/sub wake-up"
        );
    }
}

/// Watchdog renewals of locks in many slots (one script call per slot): 12 locks on a
/// 1 s lease, held for 3 s, all still held and still refused to others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_locks_spread_over_slots() {
    let cluster = RedisCluster::start(3, 0);
    let config = config().with_watchdog_lease(Duration::from_secs(1));
    let a = client(&cluster, config.clone()).await;
    let b = client(&cluster, config).await;
    let mut guards = Vec::new();
    for i in 0..12u32 {
        guards.push(a.try_lock(("renewed", i)).await.unwrap());
    }
    let slots: BTreeSet<usize> = (0..12u32)
        .map(|i| cluster.master_for_key(a.keys(("renewed", i)).unwrap().key))
        .collect();
    assert_eq!(slots.len(), 3, "locks on every master");
    let held_for = Instant::now() + Duration::from_secs(3);
    while Instant::now() < held_for {
        for g in &guards {
            assert!(g.is_held(), "{} lost while renewed", g.name());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..12u32 {
        assert!(b.try_lock(("renewed", i)).await.unwrap_err().is_busy());
    }
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Replication is asynchronous: a lock written to a master that fails over before its
/// replica got it is gone. Another owner can then take it; the first holder is told
/// through `lost()` at its next renewal, and its release says it no longer owns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_in_a_failover_fires_lost() {
    let cluster = RedisCluster::start(3, 1);
    let config = config().with_watchdog_lease(Duration::from_millis(1500));
    let a = client(&cluster, config.clone()).await;
    let b = client(&cluster, config).await;
    let hash = a.keys("fragile").unwrap().key;
    let master = cluster.master_for_key(&hash);
    let replica = cluster.replica_of(master);
    cluster.break_replication(replica);

    let guard = a.try_lock("fragile").await.unwrap();
    assert!(b.try_lock("fragile").await.unwrap_err().is_busy());
    // The replica never saw the lock; promote it anyway.
    cluster.failover(replica, FailoverMode::Takeover);
    assert_eq!(cluster.master_for_key(&hash), replica);

    let taken = b
        .acquire("fragile", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("the lock vanished with the failover, so another owner gets it");
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the first holder learns of the loss at its next renewal");
    assert!(!guard.is_held());
    let err = guard.release().await.unwrap_err();
    assert!(err.is_not_owner(), "{err}");
    taken.release().await.unwrap();
}

/// Plain acquisitions on one slot that queue behind one in flight go to the slot's
/// master as one pipeline: each caller gets its own grant or busy reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_on_one_slot_share_a_pipeline_each_with_its_own_reply() {
    let cluster = RedisCluster::start(3, 0);
    let c = client(&cluster, config().with_batches_in_flight(1)).await;
    let other = client(&cluster, config()).await;
    let names = names_on_one_slot(&c, "p", 5);
    let held = other.try_lock(names[1]).await.unwrap();
    let out = one_batch(&cluster, &c, &names).await;
    assert!(
        matches!(out[1], Err(lock_core::LockError::Busy { .. })),
        "{:?}",
        out[1]
    );
    for (i, r) in out.into_iter().enumerate() {
        if i != 1 {
            let g = r.unwrap_or_else(|e| panic!("{:?}: {e}", names[i]));
            assert!(g.is_held());
            g.release().await.unwrap();
        }
    }
    held.release().await.unwrap();
}

/// `n` names under `prefix` whose keys share one slot.
pub(crate) fn names_on_one_slot(
    c: &LockClient,
    prefix: &'static str,
    n: usize,
) -> Vec<(&'static str, u32)> {
    let slot_of = |i: u32| lock_tests::key_slot(c.keys((prefix, i)).unwrap().key);
    let slot = slot_of(0);
    (0..)
        .filter(|&i| slot_of(i) == slot)
        .take(n)
        .map(|i| (prefix, i))
        .collect()
}

/// `try_lock` of every name of `names` (keys on one slot), sent as one batch: the
/// first in flight (its SET sent, the lane taken) while the masters are paused, the
/// others queued behind it (`c` configured with one batch in flight). The answers, in
/// order.
pub(crate) async fn one_batch(
    cluster: &RedisCluster,
    c: &LockClient,
    names: &[(&'static str, u32)],
) -> Vec<Result<lock_core::LockGuard, lock_core::LockError>> {
    // The client learns the slot map.
    c.try_lock(("warm", 0))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let masters = cluster.masters();
    for &m in &masters {
        cluster.pause(m);
    }
    let (first, queued) = common::queue_behind_one(c, names[0], &names[1..]).await;
    for &m in &masters {
        cluster.resume(m);
    }
    let mut out = vec![first.await.unwrap()];
    for q in queued {
        out.push(q.await.unwrap());
    }
    out
}

/// A Cluster client made on a runtime that has ended keeps working on another: the
/// redis-rs cluster connection's task ended with that runtime.
#[test]
fn a_client_outlives_the_runtime_it_was_made_on() {
    let cluster = RedisCluster::start(3, 0);
    let rt1 = common::runtime();
    let c = rt1.block_on(client(&cluster, config()));
    rt1.block_on(async { c.try_lock("before").await.unwrap().release().await.unwrap() });
    drop(rt1);
    let rt2 = common::runtime();
    rt2.block_on(async {
        let g = c.try_lock("after").await.unwrap();
        g.release().await.unwrap();
    });
}

/// Many calls find the Cluster connection's runtime ended at once: they make one new
/// connection between them (not one each), and every call is answered.
#[test]
fn calls_that_find_the_runtime_ended_together_make_one_connection() {
    let cluster = RedisCluster::start(3, 0);
    let rt1 = common::runtime();
    let c = rt1.block_on(client(&cluster, config()));
    drop(rt1);
    let rt2 = tokio::runtime::Runtime::new().unwrap();
    rt2.block_on(async {
        let mut admin = cluster.node(0).connection().await;
        let before = connections_received(&mut admin).await;
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move { c.try_lock(("together", i)).await?.release().await })
            })
            .collect();
        for call in calls {
            call.await.unwrap().unwrap();
        }
        // A Cluster connection connects to every master once.
        let made = connections_received(&mut admin).await - before;
        assert_eq!(
            made, 1,
            "connections made to one master after the runtime ended"
        );
    });
}

/// `total_connections_received` of a node's `INFO stats`.
async fn connections_received(admin: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(admin)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("total_connections_received:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has total_connections_received")
}

/// A Redlock whose nodes are Cluster clients: the watchdog renews each node's copies
/// slot by slot (one call per slot, as a Cluster takes a multi-key script), so locks
/// whose keys are on different slots stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_over_cluster_clients_renews_locks_on_different_slots() {
    let clusters = [
        RedisCluster::start(3, 0),
        RedisCluster::start(3, 0),
        RedisCluster::start(3, 0),
    ];
    let lease = Duration::from_millis(900);
    let mut nodes = Vec::new();
    for cluster in &clusters {
        nodes.push(client(cluster, config().with_watchdog_lease(lease)).await);
    }
    let redlock = lock_core::Redlock::new(nodes).unwrap();
    let names: Vec<String> = (0..)
        .map(|i| format!("spread-{i}"))
        .scan(BTreeSet::new(), |slots, name| {
            let slot = lock_tests::key_slot(&redlock.keys(name.as_str()).unwrap()[0].key);
            Some(slots.insert(slot).then_some(name))
        })
        .flatten()
        .take(3)
        .collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(redlock.lock(name.as_str()).await.unwrap());
    }
    // Three leases: only renewals keep them.
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        for g in &guards {
            assert!(g.is_held(), "{} was lost", g.keys().name());
        }
        tokio::time::sleep(lease / 4).await;
    }
    for g in guards {
        g.release().await.unwrap();
    }
}
