//! `scripts/bench redlock`: a Redlock over 5 local masters against single-node locking
//! (one of the same masters) and against the `rslock` crate over the same 5 masters,
//! in one run.
//!
//! * Latency: one task locks and unlocks its own key in a loop; every acquire+release
//!   cycle is timed. Figures `latency <impl> p50_us / p99_us` (medians over rounds).
//! * Throughput: 16 tasks, each on its own key (`throughput <impl> cycles_per_s`).
//!
//! Ratios: `redlock_p50_vs_single` (our Redlock's p50 over single-node p50; target at
//! most 1.5, thanks to the parallel fan-out) and `redlock_vs_rslock_16_tasks` (cycles
//! per second; target at least 1.5), plus `redlock_p50_rslock_over_ours`.

use std::time::{Duration, Instant};

use lock_core::{Lease, LockClient, LockConfig, LockOptions, Redlock};
use lock_tests::RedisMasters;
use redis::aio::ConnectionManager;

use crate::measure::{
    BoxError, Cycle, Timing, check_rounds, cycle, measure_rounds, median, median_rates,
    round_order, rounds_list, spread,
};
use crate::report::{Figure, ratio_text};

const NODES: usize = 5;
const TASKS: usize = 16;
/// Implementations: single node, our Redlock, rslock.
const SINGLE: usize = 0;
const REDLOCK: usize = 1;
const RSLOCK: usize = 2;
const NAMES: [&str; 3] = ["single_node", "redlock", "rslock"];

/// Measurements this benchmark makes (for the time estimate): 3 latency + 3 throughput.
pub const MEASUREMENTS: usize = 6;

fn impls(single: LockClient, redlock: Redlock, rslock: rslock::LockManager) -> [Cycle; 3] {
    let fixed = LockOptions::new()
        .lease(Lease::Fixed(Duration::from_secs(10)))
        .wait(Duration::ZERO);
    let single = {
        let fixed = fixed.clone();
        cycle(move |t, _| {
            let (client, fixed) = (single.clone(), fixed.clone());
            async move {
                let g = client.acquire(("bench", "single", t), fixed).await?;
                g.release().await?;
                Ok(())
            }
        })
    };
    let ours = cycle(move |t, _| {
        let (redlock, fixed) = (redlock.clone(), fixed.clone());
        async move {
            let g = redlock.acquire(("bench", "redlock", t), fixed).await?;
            g.release().await?;
            Ok(())
        }
    });
    let peer = cycle(move |t, _| {
        let rslock = rslock.clone();
        async move {
            let key = format!("bench:rslock:{t}");
            let lock = rslock
                .lock(key.as_bytes(), Duration::from_secs(10))
                .await
                .map_err(|e| format!("rslock: {e:?}"))?;
            rslock.unlock(&lock).await;
            Ok(())
        }
    });
    [single, ours, peer]
}

/// One task, cycles timed one by one for `warm + measure`; returns (p50, p99) in µs.
async fn latency(cycle: &Cycle, warm: Duration, measure: Duration) -> Result<(f64, f64), BoxError> {
    let until = Instant::now() + warm;
    let mut n = 0;
    while Instant::now() < until {
        cycle(0, n).await?;
        n += 1;
    }
    let mut v = Vec::new();
    let until = Instant::now() + measure;
    while Instant::now() < until {
        let t = Instant::now();
        cycle(0, n).await?;
        n += 1;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    Ok((
        pick(0.5).unwrap_or(f64::NAN),
        pick(0.99).unwrap_or(f64::NAN),
    ))
}

/// Runs the benchmark on 5 masters of its own (`_url`, the server `bench` started, is
/// not used) and returns the figures for the `all` table.
pub async fn run(_url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let servers = RedisMasters::start(NODES);
    let urls = servers.urls();
    println!("bench redlock: {NODES} masters at {}", urls.join(" "));
    let config = LockConfig::new();
    let single = LockClient::open_with_config(urls[0].as_str(), config.clone()).await?;
    let redlock = Redlock::open(urls.iter().map(String::as_str), config)?;
    let rslock = rslock::LockManager::new(urls.clone());
    let cycles = impls(single, redlock, rslock);

    // Latency, interleaved rounds, one task.
    let mut lat: Vec<Vec<(f64, f64)>> = vec![Vec::new(); cycles.len()];
    for round in 0..rounds {
        for i in round_order(cycles.len(), round) {
            lat[i].push(latency(&cycles[i], timing.warm(round), timing.measure).await?);
        }
    }
    let p50: Vec<f64> = lat.iter().map(|l| median(l.iter().map(|x| x.0))).collect();
    let p99: Vec<f64> = lat.iter().map(|l| median(l.iter().map(|x| x.1))).collect();
    let mut lat_spread = vec![None; NAMES.len()];
    for (i, name) in NAMES.iter().enumerate() {
        println!("latency {name} p50_us {:.0} p99_us {:.0}", p50[i], p99[i]);
        println!(
            "latency {name} p50_us_rounds {}",
            rounds_list(lat[i].iter().map(|x| x.0))
        );
        lat_spread[i] = check_rounds("redlock_latency", name, spread(lat[i].iter().map(|x| x.0)));
    }

    // Throughput, interleaved rounds, 16 tasks on their own keys.
    let mut probe = ConnectionManager::new(redis::Client::open(urls[0].as_str())?).await?;
    let samples = measure_rounds(&mut probe, &cycles, TASKS, timing, rounds).await?;
    let rates = median_rates(&samples);
    let mut rate_spread = vec![None; NAMES.len()];
    for (i, name) in NAMES.iter().enumerate() {
        println!(
            "throughput tasks={TASKS} {name}_cycles_per_s {:.0}",
            rates[i]
        );
        println!(
            "throughput tasks={TASKS} {name}_cpu_us_per_cycle node0 {:.1} client {:.1}",
            median(samples[i].iter().map(|s| s.redis_us)),
            median(samples[i].iter().map(|s| s.client_us)),
        );
        println!(
            "throughput tasks={TASKS} {name}_cycles_per_s_rounds {}",
            rounds_list(samples[i].iter().map(|s| s.cycles_per_s))
        );
        rate_spread[i] = check_rounds(
            &format!("redlock_throughput_tasks={TASKS}"),
            name,
            spread(samples[i].iter().map(|s| s.cycles_per_s)),
        );
    }
    let lat_pair = |a: usize, b: usize| [lat_spread[a], lat_spread[b]];
    let rate_pair = |a: usize, b: usize| [rate_spread[a], rate_spread[b]];
    println!(
        "ratio redlock_p50_vs_single {}",
        ratio_text(p50[REDLOCK], p50[SINGLE], lat_pair(REDLOCK, SINGLE))
    );
    println!(
        "ratio redlock_p50_rslock_over_ours {}",
        ratio_text(p50[RSLOCK], p50[REDLOCK], lat_pair(RSLOCK, REDLOCK))
    );
    println!(
        "ratio redlock_vs_rslock_{TASKS}_tasks {}",
        ratio_text(rates[REDLOCK], rates[RSLOCK], rate_pair(REDLOCK, RSLOCK))
    );
    println!(
        "ratio redlock_vs_single_{TASKS}_tasks {}",
        ratio_text(rates[REDLOCK], rates[SINGLE], rate_pair(REDLOCK, SINGLE))
    );
    drop(servers);
    // Latency as a rate (1 / p50), so that "at least" targets read the same way as the
    // other rows: p50 within 1.5x of single node = ratio >= 0.67.
    let per_s = |us: f64| 1e6 / us;
    Ok(vec![
        Figure::vs(
            "redlock_p50_as_rate_vs_single_node",
            per_s(p50[REDLOCK]),
            per_s(p50[SINGLE]),
            "1/p50 per s",
        )
        .target(0.67)
        .disturbed_by(lat_spread[REDLOCK])
        .disturbed_by(lat_spread[SINGLE]),
        Figure::vs(
            "redlock_p50_as_rate_vs_rslock",
            per_s(p50[REDLOCK]),
            per_s(p50[RSLOCK]),
            "1/p50 per s",
        )
        .disturbed_by(lat_spread[REDLOCK])
        .disturbed_by(lat_spread[RSLOCK]),
        Figure::vs(
            format!("redlock_vs_rslock_{TASKS}_tasks"),
            rates[REDLOCK],
            rates[RSLOCK],
            "cycles/s",
        )
        .target(1.0)
        .disturbed_by(rate_spread[REDLOCK])
        .disturbed_by(rate_spread[RSLOCK]),
    ])
}
