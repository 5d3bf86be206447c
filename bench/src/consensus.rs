//! The consensus stores in `scripts/bench lock`: lock-core on a 3-member etcd cluster
//! against the raw etcd client issuing the same calls (the Go `concurrency.Mutex`
//! protocol by hand), and beside lock-core on ZooKeeper, each server started here.
//!
//! * **Uncontended** (`uncontended tasks=N`, N = 1 and 16, one client, each task on a
//!   name of its own): `etcd_raw` is the Go package's `TryLock` and `Unlock` (one
//!   transaction that creates `<prefix>/<lease hex>` if absent and reads the owner,
//!   then one delete) under one lease granted up front; `etcd_ours` is
//!   `EtcdLocks::try_lock` then `release` (the session lease kept alive by the
//!   watchdog); `zookeeper_ours` is the same on `ZkLocks`.
//! * **Hot name** (`hot_key`): [`CONTENDERS`] clients, one task each, on one name, so
//!   every release hands the lock to another client through a watch. `etcd_raw` is
//!   the Go package's `Lock` (queue, then watch the deletion of the key just before
//!   ours, look again, then check that our key is still there) with a lease per client.
//!
//! Servers' CPU per cycle is read from /proc for the etcd members and ZooKeeper
//! together (idle ones add their heartbeats).

use std::sync::Arc;
use std::time::Duration;

use lock_core::etcd_client::{
    self as etcd, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use lock_core::{DistributedLock, EtcdLocks, HeldLock, LockConfig, LockOptions, ZkLocks};
use lock_tests::{EtcdCluster, ZooKeeperServer};

use crate::figure::Figure;
use crate::hot::{self, HotCycle, HotSample};
use crate::measure::{
    BoxError, Cycle, Processes, Timing, acquire_cycle, cycle, measure_rounds, rates, round_order,
};

/// Concurrencies of the uncontended cycles.
const CONCURRENCIES: [usize; 2] = [1, 16];

/// Clients contending for the hot name, one task each.
pub const CONTENDERS: usize = 8;

/// Measurements per run: the uncontended implementations at each concurrency, then the
/// hot name's.
pub const MEASUREMENTS: usize = IMPLS.len() * CONCURRENCIES.len() + IMPLS.len();

/// The implementations, in measuring order of round 1 (uncontended and hot alike).
const IMPLS: [&str; 3] = ["etcd_raw", "etcd_ours", "zookeeper_ours"];
const RAW: usize = 0;
const OURS: usize = 1;
const ZK: usize = 2;

/// The raw client's lease: granted once, long enough for the whole run, so it needs
/// no keep-alive (the Go session sends one every third of its TTL: a few per run).
const RAW_LEASE_TTL_S: i64 = 3600;

/// The servers: a 3-member etcd cluster and a standalone ZooKeeper.
struct Servers {
    etcd: EtcdCluster,
    zookeeper: ZooKeeperServer,
}

impl Servers {
    fn start() -> Self {
        Servers {
            etcd: EtcdCluster::start(3),
            zookeeper: ZooKeeperServer::start(),
        }
    }

    fn cpu(&self) -> Processes {
        let mut pids = self.etcd.pids();
        pids.extend(self.zookeeper.pid());
        Processes(pids)
    }

    /// A raw client on the member lock-core's client calls first, and a lease of its
    /// own.
    async fn raw(&self) -> Result<Raw, BoxError> {
        let endpoint = format!("http://127.0.0.1:{}", self.etcd.client_port(0));
        let client = etcd::Client::connect([endpoint], None).await?;
        let lease = client
            .lease_client()
            .grant(RAW_LEASE_TTL_S, None)
            .await?
            .id();
        Ok(Raw { client, lease })
    }

    async fn etcd_ours(&self) -> Result<EtcdLocks, BoxError> {
        Ok(EtcdLocks::connect(&self.etcd.url("bench"), LockConfig::new()).await?)
    }

    async fn zookeeper_ours(&self) -> Result<ZkLocks, BoxError> {
        let cluster = self.zookeeper.connect_string();
        Ok(ZkLocks::connect(&cluster, LockConfig::new()).await?)
    }
}

/// The Go `concurrency.Mutex` protocol by hand, on one client and one lease.
#[derive(Clone)]
struct Raw {
    client: etcd::Client,
    lease: i64,
}

/// `GetOptions` for the one key of `order` create revision under a prefix.
fn first(order: SortOrder) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, order)
        .with_limit(1)
}

fn first_create_revision(op: Option<&TxnOpResponse>) -> Option<i64> {
    match op {
        Some(TxnOpResponse::Get(get)) => get.kvs().first().map(etcd::KeyValue::create_revision),
        _ => None,
    }
}

impl Raw {
    /// Go's `tryAcquire`: our key under `prefix` (`<name>/`) created if absent, the
    /// owner read in the same transaction. Answers the key, its create revision and
    /// whether it owns the lock.
    async fn enqueue(&self, prefix: &str) -> Result<(String, i64, bool), BoxError> {
        let key = format!("{prefix}{:x}", self.lease);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(self.lease)),
                ),
                TxnOp::get(prefix, Some(first(SortOrder::Ascend))),
            ])
            .or_else([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(prefix, Some(first(SortOrder::Ascend))),
            ]);
        let answer = self.client.kv_client().txn(txn).await?;
        let ops = answer.op_responses();
        let ours = match answer.succeeded() {
            true => answer.header().map(|h| h.revision()),
            false => first_create_revision(ops.first()),
        }
        .ok_or("etcd_raw: no revision for our key")?;
        let owner = first_create_revision(ops.get(1));
        Ok((key, ours, owner.is_none_or(|o| o == ours)))
    }

    /// Go's `TryLock`: the lock, or an error if someone holds it.
    async fn try_lock(&self, prefix: &str) -> Result<String, BoxError> {
        match self.enqueue(prefix).await? {
            (key, _, true) => Ok(key),
            (key, _, false) => {
                self.client.kv_client().delete(key, None).await?;
                Err("etcd_raw: the lock was taken".into())
            }
        }
    }

    /// Go's `Lock`: queue, wait for every key created before ours to go (watching the
    /// newest of them each turn), then check that ours is still there.
    async fn lock(&self, prefix: &str) -> Result<String, BoxError> {
        let (key, ours, owner) = self.enqueue(prefix).await?;
        if owner {
            return Ok(key);
        }
        let mut kv = self.client.kv_client();
        loop {
            let before = first(SortOrder::Descend).with_max_create_revision(ours - 1);
            let newest = kv.get(prefix, Some(before)).await?;
            let Some(last) = newest.kvs().first() else {
                break;
            };
            let revision = newest.header().map_or(0, |h| h.revision());
            let options = WatchOptions::new().with_start_revision(revision + 1);
            let mut stream = self
                .client
                .watch_client()
                .watch(last.key(), Some(options))
                .await?;
            while let Some(answer) = stream.message().await? {
                if answer
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    break;
                }
            }
        }
        if kv.get(key.as_str(), None).await?.kvs().is_empty() {
            return Err("etcd_raw: our key went while we waited".into());
        }
        Ok(key)
    }

    /// Go's `Unlock`.
    async fn unlock(&self, key: String) -> Result<(), BoxError> {
        self.client.kv_client().delete(key, None).await?;
        Ok(())
    }
}

fn raw_uncontended(raw: Raw) -> Cycle {
    cycle(move |t, _| {
        let raw = raw.clone();
        async move {
            let key = raw.try_lock(&format!("/bench/raw/{t}/")).await?;
            raw.unlock(key).await
        }
    })
}

/// Our try_lock and release of one name per task on `locks`.
fn ours_uncontended<L>(locks: L) -> Cycle
where
    L: DistributedLock + Clone + Send + Sync + 'static,
    L::Guard: Send,
{
    acquire_cycle(
        locks,
        "uncontended",
        LockOptions::new().wait(Duration::ZERO),
    )
}

fn raw_hot(contenders: Vec<Raw>) -> HotCycle {
    let contenders = Arc::new(contenders);
    Arc::new(move |t, stats| {
        let raw = contenders[t % contenders.len()].clone();
        Box::pin(async move {
            let called = stats.calling();
            let key = raw.lock("/bench/raw/hot/").await?;
            stats.granted(t, called);
            stats.releasing(t);
            raw.unlock(key).await
        })
    })
}

/// Task `t` locks the one hot name on `contenders[t]` and releases it.
fn ours_hot<L>(contenders: Vec<L>) -> HotCycle
where
    L: DistributedLock + Send + Sync + 'static,
    L::Guard: Send,
{
    let contenders = Arc::new(contenders);
    let wait = LockOptions::new().wait(Duration::from_secs(30));
    Arc::new(move |t, stats| {
        let (contenders, wait) = (contenders.clone(), wait.clone());
        Box::pin(async move {
            let locks = &contenders[t % contenders.len()];
            let called = stats.calling();
            let g = locks.acquire(("bench", "hot"), wait).await?;
            stats.granted(t, called);
            stats.releasing(t);
            stats.released(g.release().await)
        })
    })
}

/// Measures every implementation uncontended at 1 and 16 tasks and on the hot name,
/// `rounds` interleaved rounds each, on servers started here; prints the medians, the
/// per-round rates and each ratio's line.
pub async fn run(timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let servers = Servers::start();
    println!(
        "bench lock: etcd 3 members at {}, zookeeper at {}",
        servers.etcd.url(""),
        servers.zookeeper.connect_string()
    );
    let mut figures = uncontended(&servers, timing, rounds).await?;
    figures.extend(hot_name(&servers, timing, rounds).await?);
    Ok(figures)
}

async fn uncontended(
    servers: &Servers,
    timing: Timing,
    rounds: usize,
) -> Result<Vec<Figure>, BoxError> {
    let cycles = [
        raw_uncontended(servers.raw().await?),
        ours_uncontended(servers.etcd_ours().await?),
        ours_uncontended(servers.zookeeper_ours().await?),
    ];
    let mut cpu = servers.cpu();
    let mut figures = Vec::new();
    for tasks in CONCURRENCIES {
        let samples = measure_rounds(&mut cpu, &cycles, tasks, timing, rounds).await?;
        for (name, s) in IMPLS.iter().zip(&samples) {
            crate::uncontended::print(tasks, "servers", name, name, s);
        }
        let figure = |name: &str, a: usize, b: usize| {
            let name = format!("{name}_{tasks}_tasks");
            Figure::rounds(name, "cycles/s", &rates(&samples[a]), &rates(&samples[b]))
        };
        let table = [
            figure("etcd_ours_vs_raw", OURS, RAW).target(0.9),
            figure("etcd_ours_vs_zookeeper_ours", OURS, ZK),
        ];
        for f in &table {
            println!("{}", f.ratio_line());
        }
        figures.extend(table);
    }
    Ok(figures)
}

async fn hot_name(
    servers: &Servers,
    timing: Timing,
    rounds: usize,
) -> Result<Vec<Figure>, BoxError> {
    let (mut raw, mut etcd, mut zk) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..CONTENDERS {
        raw.push(servers.raw().await?);
        etcd.push(servers.etcd_ours().await?);
        zk.push(servers.zookeeper_ours().await?);
    }
    let cycles = [raw_hot(raw), ours_hot(etcd), ours_hot(zk)];
    let mut samples: Vec<Vec<HotSample>> = vec![Vec::with_capacity(rounds); IMPLS.len()];
    for round in 0..rounds {
        for i in round_order(IMPLS.len(), round) {
            let s = hot::measure(&cycles[i], CONTENDERS, timing.warm(round), timing.measure);
            samples[i].push(s.await?);
        }
    }
    for (name, s) in IMPLS.iter().zip(&samples) {
        hot::print(name, &HotSample::medians(s), s);
    }
    let per_round = |i: usize, pick: fn(&HotSample) -> f64| -> Vec<f64> {
        samples[i].iter().map(pick).collect()
    };
    let (p50, p99) = (|s: &HotSample| s.p50_us, |s: &HotSample| s.p99_us);
    let rate = |s: &HotSample| s.handoffs_per_s;
    let latency = |name: &str, pick: fn(&HotSample) -> f64, b: usize| {
        Figure::lower_is_better(name, "us", &per_round(OURS, pick), &per_round(b, pick))
    };
    let table = [
        Figure::rounds(
            "hot_etcd_handoffs_ours_vs_raw",
            "handoffs/s",
            &per_round(OURS, rate),
            &per_round(RAW, rate),
        )
        .target(0.9),
        latency("hot_etcd_handoff_p50_ours_vs_raw", p50, RAW).target(0.9),
        latency("hot_etcd_handoff_p99_ours_vs_raw", p99, RAW).target(0.9),
        latency("hot_etcd_handoff_p50_ours_vs_zookeeper_ours", p50, ZK),
        latency("hot_etcd_handoff_p99_ours_vs_zookeeper_ours", p99, ZK),
    ];
    for f in &table {
        println!("{}", f.ratio_line());
    }
    Ok(table.to_vec())
}
