//! `scripts/bench seckill`: the flash sale of `scripts/demo` as a throughput figure,
//! beside its floor.
//!
//! Two release-built `seckill-server` processes (the binary beside this one; `scripts/bench`
//! builds it) on the benchmark's redis-server and a temporary SQLite file; each round
//! sells 100 units to 2000 concurrent buyers with the load generator
//! (`lock_examples::seckill::load`). A round whose verdict fails is an error, so the
//! figure is never from a broken run. The floor: two more processes started with
//! `--floor`, the same HTTP stack and routes whose order only runs the stock script (no
//! lock, idempotency key or rate limit); rounds alternate between the two, so both see
//! the same machine. Two more run with `--no-batching` (every lock, rate-limit and
//! idempotency call sent on its own), to show what batching changes. Prints each round,
//! the medians, and the ratios, each the median of the per-round ratios (targets:
//! requests/s >= 0.5x the floor's, p99 <= 2x the floor's).

use lock_examples::seckill::instances::{Instance, server_binary};
use lock_examples::seckill::load::{self, LoadConfig};

use crate::figure::Figure;
use crate::measure::{BoxError, Timing, median};

/// Indices of the three service configurations measured.
const OURS: usize = 0;
const UNBATCHED: usize = 1;
const FLOOR: usize = 2;

/// The demo's size.
const CONFIG: LoadConfig = LoadConfig {
    buyers: 2000,
    stock: 100,
};

pub async fn run(url: &str, _timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let bin = server_binary()?;
    let dir = std::env::temp_dir().join(format!("lock-bench-seckill-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let db = dir.join("orders.db");
    let result = async {
        // The benchmark's redis-server is shared by every bench and keeps nothing.
        let spawn = |extra: &'static [&'static str], db: std::path::PathBuf| {
            let bin = bin.clone();
            async move {
                let mut instances = Vec::new();
                for _ in 0..2 {
                    instances.push(Instance::spawn(&bin, url, &db, extra).await?);
                }
                Ok::<_, BoxError>(instances)
            }
        };
        let ours = spawn(&["--allow-volatile-redis"], db.clone()).await?;
        let unbatched = spawn(&["--allow-volatile-redis", "--no-batching"], db.clone()).await?;
        // One Redis stream and consumer group for all: the floor's workers persist into
        // the same SQLite file, or ours would find rows missing.
        let floor = spawn(&["--allow-volatile-redis", "--floor"], db.clone()).await?;
        let urls = |is: &[Instance]| is.iter().map(|i| i.url.clone()).collect::<Vec<_>>();
        // Measured in this order in every round: ours, ours unbatched, the floor.
        let sets = [urls(&ours), urls(&unbatched), urls(&floor)];
        let names = ["ours", "ours_unbatched", "floor"];
        let (mut rates, mut p99s) = ([vec![], vec![], vec![]], [vec![], vec![], vec![]]);
        for round in 0..rounds {
            let mut line = format!("seckill round {round}");
            for (i, set) in sets.iter().enumerate() {
                let v = load::run(CONFIG, set).await?;
                // The floor has no idempotency or rate limit: its verdict is not judged.
                if i != FLOOR && !v.violations().is_empty() {
                    return Err(format!("the seckill verdict failed ({}):\n{v}", names[i]).into());
                }
                let p99 = v.p99.as_secs_f64() * 1000.0;
                line += &format!(
                    " | {} requests_per_s {:.0} p50_ms {:.1} p99_ms {p99:.1}",
                    names[i],
                    v.throughput(),
                    v.p50.as_secs_f64() * 1000.0
                );
                rates[i].push(v.throughput());
                p99s[i].push(p99);
            }
            println!("{line}");
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
        // Lower is better: the ratio is b's p99 over a's, so >= 0.5 means a's is <= 2x b's.
        let p99_vs = |label: &str, a: usize, b: usize| {
            Figure::lower_is_better(label, "ms", &p99s[a], &p99s[b])
        };
        let figures = vec![
            rate_vs(
                "seckill_requests_per_s_vs_floor (2 instances, 2000 buyers, 100 units)",
                OURS,
                FLOOR,
            )
            .target(0.5),
            p99_vs("seckill_p99_floor_over_ours_ms", OURS, FLOOR).target(0.5),
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
