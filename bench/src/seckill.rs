//! `scripts/bench seckill`: the flash sale of `scripts/demo` as a throughput figure.
//!
//! Two release-built `seckill-server` processes (the binary beside this one; `scripts/bench`
//! builds it) on the benchmark's redis-server and a temporary SQLite file; each round
//! sells 100 units to 2000 concurrent buyers with the load generator
//! (`lock_examples::seckill::load`). A round whose verdict fails is an error, so the
//! figure is never from a broken run. Prints each round's throughput and latency and
//! returns the medians. No baseline: this is the whole service, not one feature.

use lock_examples::seckill::instances::{Instance, server_binary};
use lock_examples::seckill::load::{self, LoadConfig};

use crate::measure::{BoxError, Timing, median};
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
        let mut instances = Vec::new();
        for _ in 0..2 {
            // The benchmark's redis-server is shared by every bench and keeps nothing.
            let volatile = ["--allow-volatile-redis"];
            instances.push(Instance::spawn(&bin, url, &db, &volatile).await?);
        }
        let urls: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
        let (mut rates, mut p99s) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let v = load::run(CONFIG, &urls).await?;
            if !v.violations().is_empty() {
                return Err(format!("the seckill verdict failed:\n{v}").into());
            }
            let p99_ms = v.p99.as_secs_f64() * 1000.0;
            println!(
                "seckill round {round} requests_per_s {:.0} p50_ms {:.1} p99_ms {p99_ms:.1}",
                v.throughput(),
                v.p50.as_secs_f64() * 1000.0
            );
            rates.push(v.throughput());
            p99s.push(p99_ms);
        }
        let (rate, p99) = (median(rates), median(p99s));
        println!("seckill requests_per_s {rate:.0} p99_ms {p99:.1}");
        Ok(vec![
            Figure::alone(
                "seckill_requests_per_s (2 instances, 2000 buyers, 100 units)",
                rate,
                "requests/s",
            ),
            Figure::alone("seckill_p99_latency", p99, "ms"),
        ])
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}
