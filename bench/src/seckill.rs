//! `scripts/bench seckill`: the flash sale of `scripts/demo` as a throughput figure,
//! beside its floor.
//!
//! Two release-built `seckill-server` processes (the binary beside this one; `scripts/bench`
//! builds it) on the benchmark's redis-server and a temporary SQLite file; a sale sells
//! 100 units to 2000 concurrent buyers with the load generator
//! (`lock_examples::seckill::load`), and each round runs sales back to back for
//! `--seconds` (at least one) per configuration, the configurations in rotated order:
//! one sale lasts a fraction of a second, too short to stand for a round. A round's
//! requests/s is over all its sales, its p50 and p99 the medians of theirs. A sale
//! whose verdict fails is an error, so the figure is never from a broken run. The floor: two more processes started with
//! `--floor`, the same HTTP stack and routes whose order only runs the stock script (no
//! lock, idempotency key or rate limit); rounds interleave the configurations, so all
//! see the same machine. Two more run with `--no-batching` (every lock, rate-limit and
//! idempotency call sent on its own), to show what batching changes. Two more pairs run
//! the service on the other combinations of database and queue, each on a private
//! redis-server (their own stream and outbox) and one private MariaDB: MySQL + Stream
//! and MySQL + RabbitMQ (a private node). Prints each round, the medians per
//! configuration (requests/s and p99: `ours` is SQLite + Stream), and the ratios, each
//! the median of the per-round ratios (targets: requests/s >= 0.8x the floor's, p99 <=
//! 1.5x the floor's).

use lock_examples::seckill::instances::{Instance, server_binary};
use lock_examples::seckill::load::{self, LoadConfig};
use lock_tests::{MariaDbServer, RabbitMqServer, RedisServer};

use crate::figure::Figure;
use std::time::{Duration, Instant};

use crate::measure::{BoxError, Timing, median, round_order};

/// Indices of the service configurations measured (`OURS` and the two after `FLOOR`
/// are the three combinations of database and queue).
const OURS: usize = 0;
const UNBATCHED: usize = 1;
const FLOOR: usize = 2;
/// The configurations each round measures (the time estimate counts them).
pub const NAMES: [&str; 5] = [
    "ours",
    "ours_unbatched",
    "floor",
    "ours_mysql_stream",
    "ours_mysql_rabbitmq",
];

/// The figure of requests/s against the floor's (its instruction counts join it).
pub const VS_FLOOR: &str = "seckill_requests_per_s_vs_floor (2 instances, 2000 buyers, 100 units)";

/// The demo's size.
const CONFIG: LoadConfig = LoadConfig {
    buyers: 2000,
    stock: 100,
};

/// One round of one configuration (`urls`, named `name`): sales back to back until
/// `measure` has passed, at least one. Returns requests per second over them all, the
/// median p50 and p99 in milliseconds, and the number of sales.
async fn round(
    urls: &[String],
    name: &str,
    measure: Duration,
) -> Result<(f64, f64, f64, usize), BoxError> {
    let start = Instant::now();
    let (mut requests, mut busy, mut p50s, mut p99s) = (0.0, 0.0, vec![], vec![]);
    while p99s.is_empty() || start.elapsed() < measure {
        let v = load::run(CONFIG, urls).await?;
        // The floor has no idempotency or rate limit: its verdict is not judged.
        if name != "floor" && !v.violations().is_empty() {
            return Err(format!("the seckill verdict failed ({name}):\n{v}").into());
        }
        requests += v.requests as f64;
        busy += v.requests as f64 / v.throughput();
        p50s.push(v.p50.as_secs_f64() * 1000.0);
        p99s.push(v.p99.as_secs_f64() * 1000.0);
    }
    Ok((
        requests / busy,
        median(p50s),
        median(p99s.iter().copied()),
        p99s.len(),
    ))
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let bin = server_binary()?;
    let dir = std::env::temp_dir().join(format!("lock-bench-seckill-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("orders.db");
    let result = async {
        // The benchmark's redis-server is shared by every bench and keeps nothing.
        let spawn = |redis: String, db: String, extra: Vec<String>| {
            let bin = bin.clone();
            async move {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let mut instances = Vec::new();
                for _ in 0..2 {
                    instances.push(Instance::spawn(&bin, &redis, &db, &extra).await?);
                }
                Ok::<_, BoxError>(instances)
            }
        };
        let sqlite = db.display().to_string();
        let ours = spawn(
            url.into(),
            sqlite.clone(),
            args(&["--allow-volatile-redis"]),
        )
        .await?;
        let unbatched = spawn(
            url.into(),
            sqlite.clone(),
            args(&["--allow-volatile-redis", "--no-batching"]),
        )
        .await?;
        // One Redis stream and consumer group for all: the floor's workers persist into
        // the same SQLite file, or ours would find rows missing.
        let floor = spawn(
            url.into(),
            sqlite,
            args(&["--allow-volatile-redis", "--floor"]),
        )
        .await?;
        // The other combinations: Redis of their own, so no worker of one takes the
        // orders of another; one MariaDB, whose voucher ids never repeat.
        let (mysql, rabbit, redis_mysql, redis_rabbit) = tokio::task::spawn_blocking(|| {
            (
                MariaDbServer::start_with_args(&["--innodb-flush-log-at-trx-commit=1"]),
                RabbitMqServer::start(),
                RedisServer::start(),
                RedisServer::start(),
            )
        })
        .await?;
        let mysql_stream = spawn(
            redis_mysql.url(),
            mysql.url(),
            args(&["--allow-volatile-redis"]),
        )
        .await?;
        let mysql_rabbit = spawn(
            redis_rabbit.url(),
            mysql.url(),
            args(&["--allow-volatile-redis", "--queue", &rabbit.url()]),
        )
        .await?;
        let urls = |is: &[Instance]| is.iter().map(|i| i.url.clone()).collect::<Vec<_>>();
        let sets = [
            urls(&ours),
            urls(&unbatched),
            urls(&floor),
            urls(&mysql_stream),
            urls(&mysql_rabbit),
        ];
        let names = NAMES;
        let (mut rates, mut p99s): ([Vec<f64>; 5], [Vec<f64>; 5]) = Default::default();
        for r in 0..rounds {
            let mut parts: [String; 5] = Default::default();
            for i in round_order(sets.len(), r) {
                let (rate, p50, p99, sales) = round(&sets[i], names[i], timing.measure).await?;
                parts[i] = format!(
                    " | {} requests_per_s {rate:.0} p50_ms {p50:.1} p99_ms {p99:.1} sales {sales}",
                    names[i]
                );
                rates[i].push(rate);
                p99s[i].push(p99);
            }
            println!("seckill round {r}{}", parts.concat());
        }
        for (i, name) in names.iter().enumerate() {
            println!(
                "seckill {name} requests_per_s {:.0} p99_ms {:.1}",
                median(rates[i].iter().copied()),
                median(p99s[i].iter().copied())
            );
        }
        let rate_vs = |label: &str, a: usize, b: usize| {
            Figure::rounds(label, "requests/s", &rates[a], &rates[b])
        };
        // Lower is better: the ratio is b's p99 over a's, so >= 0.67 means a's is <= 1.5x
        // b's.
        let p99_vs = |label: &str, a: usize, b: usize| {
            Figure::lower_is_better(label, "ms", &p99s[a], &p99s[b])
        };
        let figures = vec![
            rate_vs(VS_FLOOR, OURS, FLOOR).target(0.8),
            p99_vs("seckill_p99_floor_over_ours_ms", OURS, FLOOR).target(0.67),
            rate_vs(
                "seckill_requests_per_s_batched_vs_unbatched",
                OURS,
                UNBATCHED,
            ),
            p99_vs("seckill_p99_unbatched_over_batched_ms", OURS, UNBATCHED),
        ];
        for f in &figures {
            println!("{}", f.ratio_line());
        }
        Ok(figures)
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
