//! `scripts/bench redlock`: a Redlock over 5 local masters against single-node locking
//! (one of the same masters) and against the `rslock` crate over the same 5 masters,
//! in one run.
//!
//! * Latency: one task locks and unlocks its own key in a loop; every acquire+release
//!   cycle is timed. Figures `latency <impl> p50_us / p99_us` (medians over rounds).
//! * Throughput: 16 tasks, each on its own key (`throughput <impl> cycles_per_s`).
//!
//! Ratios, each the median of the per-round ratios: `redlock_p50_as_rate_vs_single_node`
//! (single-node p50 over our Redlock's; target at least 0.67, i.e. a p50 at most 1.5x,
//! thanks to the parallel fan-out), `redlock_p50_as_rate_vs_rslock` (rslock's p50 over
//! ours), `redlock_vs_rslock_16_tasks` (cycles per second; target at least 1.0), plus
//! `redlock_vs_single_16_tasks` and `redlock_vs_redlock_unbatched_16_tasks` (the same
//! Redlock with batching off on its nodes).

use lock_core::{LockClient, LockConfig, Redlock};
use lock_tests::RedisMasters;
use redis::aio::ConnectionManager;

use crate::figure::Figure;
use crate::measure::{
    BoxError, Cycle, Timing, fixed_lease_cycle, latency_rounds, measure_rounds, median,
    median_rates, rates, rounds_list, rslock_cycle,
};

const NODES: usize = 5;
const TASKS: usize = 16;
/// Implementations: single node, our Redlock, rslock, our Redlock without batching.
const SINGLE: usize = 0;
const REDLOCK: usize = 1;
const RSLOCK: usize = 2;
const UNBATCHED: usize = 3;
/// Their names, in the output and in `lock-bench ops redlock.<name>`.
pub const NAMES: [&str; 4] = ["single_node", "redlock", "rslock", "redlock_unbatched"];

/// Measurements this benchmark makes (for the time estimate): 4 latency + 4 throughput.
pub const MEASUREMENTS: usize = 8;

/// Every implementation of [`NAMES`], in order, over the masters `urls` (the single
/// node on the first).
async fn impls(urls: &[String]) -> Result<[Cycle; 4], BoxError> {
    let config = LockConfig::new();
    let single = LockClient::open_with_config(urls[0].as_str(), config.clone()).await?;
    let redlock = Redlock::open(urls.iter().map(String::as_str), config.clone())?;
    let unbatched = Redlock::open(urls.iter().map(String::as_str), config.with_batching(false))?;
    Ok([
        fixed_lease_cycle(single, "single"),
        fixed_lease_cycle(redlock, "redlock"),
        rslock_cycle(rslock::LockManager::new(urls.to_vec())),
        fixed_lease_cycle(unbatched, "redlock_unbatched"),
    ])
}

/// Implementation `name` of [`NAMES`] over the masters `urls` (comma-separated), for
/// `lock-bench ops redlock.<name>`; `None` for an unknown name.
pub async fn op(urls: &str, name: &str) -> Result<Option<Cycle>, BoxError> {
    let Some(i) = NAMES.iter().position(|n| *n == name) else {
        return Ok(None);
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    Ok(impls(&urls).await?.into_iter().nth(i))
}

/// Runs the benchmark on 5 masters of its own (`_url`, the server `bench` started, is
/// not used) and returns the figures for the `all` table.
pub async fn run(_url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let servers = RedisMasters::start(NODES);
    let urls = servers.urls();
    println!("bench redlock: {NODES} masters at {}", urls.join(" "));
    let cycles = impls(&urls).await?;

    // Latency, interleaved rounds, one task.
    let lat = latency_rounds(&cycles.iter().collect::<Vec<_>>(), timing, rounds).await?;
    let p50: Vec<f64> = lat.iter().map(|l| median(l.iter().map(|x| x.0))).collect();
    let p99: Vec<f64> = lat.iter().map(|l| median(l.iter().map(|x| x.1))).collect();
    for (i, name) in NAMES.iter().enumerate() {
        println!("latency {name} p50_us {:.0} p99_us {:.0}", p50[i], p99[i]);
        println!(
            "latency {name} p50_us_rounds {}",
            rounds_list(lat[i].iter().map(|x| x.0))
        );
    }

    // Throughput, interleaved rounds, 16 tasks on their own keys.
    let mut probe = ConnectionManager::new(redis::Client::open(urls[0].as_str())?).await?;
    let samples = measure_rounds(&mut probe, &cycles, TASKS, timing, rounds).await?;
    let medians = median_rates(&samples);
    for (i, name) in NAMES.iter().enumerate() {
        println!(
            "throughput tasks={TASKS} {name}_cycles_per_s {:.0}",
            medians[i]
        );
        println!(
            "throughput tasks={TASKS} {name}_cpu_us_per_cycle node0 {:.1} client {:.1}",
            median(samples[i].iter().map(|s| s.server_us)),
            median(samples[i].iter().map(|s| s.client_us)),
        );
        println!(
            "throughput tasks={TASKS} {name}_cycles_per_s_rounds {}",
            rounds_list(rates(&samples[i]))
        );
    }
    drop(servers);
    // Latency as a rate (1 / p50), so that "at least" targets read the same way as the
    // other rows: p50 within 1.5x of single node = ratio >= 0.67.
    let p50_rate = |i: usize| -> Vec<f64> { lat[i].iter().map(|x| 1e6 / x.0).collect() };
    let latency = |name: &str, b: usize| {
        Figure::rounds(name, "1/p50 per s", &p50_rate(REDLOCK), &p50_rate(b))
    };
    let throughput = |name: String, b: usize| {
        Figure::rounds(
            name,
            "cycles/s",
            &rates(&samples[REDLOCK]),
            &rates(&samples[b]),
        )
    };
    let table = [
        latency("redlock_p50_as_rate_vs_single_node", SINGLE).target(0.67),
        latency("redlock_p50_as_rate_vs_rslock", RSLOCK),
        throughput(format!("redlock_vs_rslock_{TASKS}_tasks"), RSLOCK).target(1.0),
    ];
    let printed = [
        throughput(format!("redlock_vs_single_{TASKS}_tasks"), SINGLE),
        throughput(
            format!("redlock_vs_redlock_unbatched_{TASKS}_tasks"),
            UNBATCHED,
        ),
    ];
    for f in table.iter().chain(&printed) {
        println!("{}", f.ratio_line());
    }
    Ok(table.to_vec())
}
