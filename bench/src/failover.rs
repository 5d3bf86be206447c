//! `scripts/bench failover`: how long leadership takes to pass, per store. Two
//! candidates of one election, each on a handle of its own (a client, a pool, a
//! session); one leads while the other campaigns. The leader resigns; the figure is
//! the time from the start of its resignation (the old leader's loss) to the moment
//! the other's campaign resolves (the new leader's start). They swap roles and go
//! again, for `--seconds` per round, stores interleaved over `--rounds`.
//!
//! Figures (informational, no baseline: `failover_<store>_p50_ms`, `_p99_ms`): the
//! medians over the rounds of each round's p50 and p99. A leader that crashes instead
//! of resigning passes on after its lease (Redis, memory: the watchdog lease, 30 s by
//! default) or its session (ZooKeeper, etcd, PostgreSQL, MySQL) ends: that is
//! configuration, not measured here.

use std::time::{Duration, Instant};

use lock_core::{AnyLocks, Election, LockConfig};
use lock_tests::{EtcdCluster, MariaDbServer, PostgresServer, ZooKeeperServer};

use crate::figure::Figure;
use crate::measure::{BoxError, Timing, median, percentile, round_order, rounds_list};

/// The stores, in the order of their figures.
pub const STORES: [&str; 6] = ["memory", "redis", "postgres", "mysql", "zookeeper", "etcd"];

/// Handovers of one round: the leader resigns, the other takes over, roles swap.
async fn handovers(
    candidates: &[Election<AnyLocks, &'static str>; 2],
    warm: Duration,
    measure: Duration,
) -> Result<Vec<f64>, BoxError> {
    let wait = Duration::from_secs(30);
    let mut leader = candidates[0].campaign(wait).await?;
    let mut next = 1;
    let mut times = Vec::new();
    let started = Instant::now();
    while started.elapsed() < warm + measure {
        // The challenger campaigns first and has 20 ms to queue in the store before the
        // leader steps down (had it not, its first round trip would count too).
        let step_down = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let resigned = Instant::now();
            leader.resign().await.map(|_| resigned)
        };
        let (resigned, led) = tokio::join!(step_down, candidates[next].campaign(wait));
        let (resigned, new_leader) = (resigned?, led?);
        if started.elapsed() > warm {
            times.push(resigned.elapsed().as_secs_f64() * 1e3);
        }
        leader = new_leader;
        next = 1 - next;
    }
    leader.resign().await?;
    Ok(times)
}

/// Runs the benchmark on servers of its own, beside the redis-server `bench` started
/// (`url`), and returns its figures.
pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let postgres = PostgresServer::start();
    let mariadb = MariaDbServer::start();
    let zookeeper = ZooKeeperServer::start();
    let etcd = EtcdCluster::start(3);
    let urls = [
        "memory://".to_owned(),
        url.to_owned(),
        postgres.url(),
        mariadb.url(),
        format!("zk://{}", zookeeper.connect_string()),
        etcd.url("failover"),
    ];
    let mut elections = Vec::new();
    for url in &urls {
        let config = LockConfig::new();
        let first = AnyLocks::open(url, config.clone()).await?;
        // Memory is one process's store: both candidates share it.
        let second = if url.starts_with("memory") {
            first.clone()
        } else {
            AnyLocks::open(url, config).await?
        };
        elections.push([
            Election::new(first, "bench-failover"),
            Election::new(second, "bench-failover"),
        ]);
    }
    let mut samples: Vec<Vec<(f64, f64)>> = vec![Vec::new(); STORES.len()];
    for round in 0..rounds {
        for i in round_order(STORES.len(), round) {
            let mut times = handovers(&elections[i], timing.warm(round), timing.measure).await?;
            if times.is_empty() {
                return Err(format!("failover {}: no handover in a round", STORES[i]).into());
            }
            times.sort_by(f64::total_cmp);
            samples[i].push((percentile(&times, 0.5), percentile(&times, 0.99)));
        }
    }
    let mut figures = Vec::new();
    for (store, s) in STORES.iter().zip(&samples) {
        let p50 = median(s.iter().map(|x| x.0));
        let p99 = median(s.iter().map(|x| x.1));
        println!("failover {store} p50_ms {p50:.2} p99_ms {p99:.2}");
        println!(
            "failover {store} p50_ms_rounds {}",
            rounds_list(s.iter().map(|x| x.0))
        );
        figures.push(Figure::alone(format!("failover_{store}_p50_ms"), p50, "ms"));
        figures.push(Figure::alone(format!("failover_{store}_p99_ms"), p99, "ms"));
    }
    Ok(figures)
}
