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
//! the same machine. Prints each round and returns the medians and the ratios (targets:
//! requests/s >= 0.5x the floor's, p99 <= 2x the floor's).

use lock_examples::seckill::instances::{Instance, server_binary};
use lock_examples::seckill::load::{self, LoadConfig};

use crate::measure::{BoxError, Timing, check_rounds, median, spread};
use crate::report::Figure;

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
        // One Redis stream and consumer group for all four: the floor's workers persist
        // into the same SQLite file, or ours would find rows missing.
        let floor = spawn(&["--allow-volatile-redis", "--floor"], db.clone()).await?;
        let urls = |is: &[Instance]| is.iter().map(|i| i.url.clone()).collect::<Vec<_>>();
        let (ours_urls, floor_urls) = (urls(&ours), urls(&floor));
        let (mut rates, mut p99s, mut floor_rates, mut floor_p99s) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let v = load::run(CONFIG, &ours_urls).await?;
            if !v.violations().is_empty() {
                return Err(format!("the seckill verdict failed:\n{v}").into());
            }
            // The floor has no idempotency or rate limit: its verdict is not judged.
            let f = load::run(CONFIG, &floor_urls).await?;
            let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
            println!(
                "seckill round {round} requests_per_s {:.0} p50_ms {:.1} p99_ms {:.1} | floor requests_per_s {:.0} p50_ms {:.1} p99_ms {:.1}",
                v.throughput(),
                ms(v.p50),
                ms(v.p99),
                f.throughput(),
                ms(f.p50),
                ms(f.p99)
            );
            rates.push(v.throughput());
            p99s.push(ms(v.p99));
            floor_rates.push(f.throughput());
            floor_p99s.push(ms(f.p99));
        }
        let rounds_spread = |name: &str, v: &[f64]| {
            check_rounds("seckill", name, spread(v.iter().copied()))
        };
        let disturbed = [
            rounds_spread("ours_requests_per_s", &rates),
            rounds_spread("floor_requests_per_s", &floor_rates),
            rounds_spread("ours_p99", &p99s),
            rounds_spread("floor_p99", &floor_p99s),
        ];
        let (rate, p99) = (median(rates), median(p99s));
        let (floor_rate, floor_p99) = (median(floor_rates), median(floor_p99s));
        println!(
            "seckill requests_per_s {rate:.0} p99_ms {p99:.1}; floor requests_per_s {floor_rate:.0} p99_ms {floor_p99:.1}"
        );
        Ok(vec![
            Figure::vs(
                "seckill_requests_per_s_vs_floor (2 instances, 2000 buyers, 100 units)",
                rate,
                floor_rate,
                "requests/s",
            )
            .target(0.5)
            .disturbed_by(disturbed[0])
            .disturbed_by(disturbed[1]),
            // Lower is better: the floor's p99 over ours, so >= 0.5 means ours <= 2x.
            Figure::vs("seckill_p99_floor_over_ours_ms", floor_p99, p99, "ms")
                .target(0.5)
                .disturbed_by(disturbed[2])
                .disturbed_by(disturbed[3]),
        ])
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
