//! `scripts/bench macro`: an `#[cache_lock]` fn against the same work written by hand
//! with the lock-core API, interleaved rounds, medians.

use std::time::Duration;

use lock_core::{Lease, LockClient, LockError, LockOptions};
use lock_macros::cache_lock;
use redis::aio::ConnectionManager;

use crate::measure::{
    BoxError, Cycle, Timing, check_all, cycle, measure_rounds, median_rates, rounds_list,
};
use crate::report::{Figure, ratio_text};

/// The body both versions run: trivial, so the lock's cost is what shows.
fn work(id: u64) -> u64 {
    id.wrapping_mul(31)
}

#[cache_lock(prefix = "bench-macro", key = id, expire = "10s", client = client)]
async fn annotated(client: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(work(id))
}

/// What `annotated` does, by hand: same lock name, lease, no waiting, release after.
async fn by_hand(client: &LockClient, id: u64) -> Result<u64, LockError> {
    let options = LockOptions::new()
        .lease(Lease::Fixed(Duration::from_secs(10)))
        .wait(Duration::ZERO);
    let guard = client.acquire(("bench-macro", id), options).await?;
    let result = Ok(work(id));
    guard.release().await?;
    result
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let mut figures = Vec::new();
    let client = LockClient::open(url).await?;
    let mut probe = ConnectionManager::new(redis::Client::open(url)?).await?;
    let impls: [(&str, Cycle); 2] = [
        ("by_hand", {
            let client = client.clone();
            cycle(move |t, _| {
                let client = client.clone();
                async move {
                    by_hand(&client, t as u64).await?;
                    Ok(())
                }
            })
        }),
        ("annotated", {
            let client = client.clone();
            cycle(move |t, _| {
                let client = client.clone();
                async move {
                    annotated(&client, t as u64).await?;
                    Ok(())
                }
            })
        }),
    ];
    for tasks in [1usize, 64] {
        let cycles: Vec<Cycle> = impls.iter().map(|(_, c)| c.clone()).collect();
        let samples = measure_rounds(&mut probe, &cycles, tasks, timing, rounds).await?;
        let rates = median_rates(&samples);
        for ((name, _), (s, r)) in impls.iter().zip(samples.iter().zip(&rates)) {
            println!("macro tasks={tasks} {name}_calls_per_s {r:.0}");
            println!(
                "macro tasks={tasks} {name}_calls_per_s_rounds {}",
                rounds_list(s.iter().map(|s| s.cycles_per_s))
            );
        }
        let names: Vec<&str> = impls.iter().map(|(n, _)| *n).collect();
        let spreads = check_all(&format!("macro_tasks={tasks}"), &names, &samples);
        let name = format!("macro_vs_by_hand_{tasks}_tasks");
        println!(
            "ratio {name} {}",
            ratio_text(rates[1], rates[0], [spreads[1], spreads[0]])
        );
        figures.push(Figure::between(name, (1, 0), &rates, &spreads, "calls/s").target(0.95));
    }
    Ok(figures)
}
