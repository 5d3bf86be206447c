//! `scripts/bench macro`: an `#[cache_lock]` fn against the same work written by hand
//! with the lock-core API, interleaved rounds, judged on the per-round ratio.

use std::time::Duration;

use lock_core::{Lease, LockClient, LockError, LockOptions};
use lock_macros::cache_lock;
use redis::aio::ConnectionManager;

use crate::figure::Figure;
use crate::measure::{BoxError, Cycle, Timing, cycle, measure_rounds, median_rates, rates};

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

/// The implementations, in measuring order: the names of the rate lines and of
/// `lock-bench ops macro.<name>`.
pub const OPS: [&str; 2] = ["by_hand", "annotated"];

/// Implementation `name` on `client`; `None` for an unknown name.
fn build(client: &LockClient, name: &str) -> Option<Cycle> {
    let client = client.clone();
    let annotated_fn = name == "annotated";
    OPS.contains(&name).then(|| {
        cycle(move |t, _| {
            let client = client.clone();
            async move {
                if annotated_fn {
                    annotated(&client, t as u64).await?;
                } else {
                    by_hand(&client, t as u64).await?;
                }
                Ok(())
            }
        })
    })
}

/// Implementation `name`'s cycle on `url`, for `lock-bench ops`; `None` for an unknown
/// name.
pub async fn op(url: &str, name: &str) -> Result<Option<Cycle>, BoxError> {
    if !OPS.contains(&name) {
        return Ok(None);
    }
    Ok(build(&LockClient::open(url).await?, name))
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let mut figures = Vec::new();
    let client = LockClient::open(url).await?;
    let mut probe = ConnectionManager::new(redis::Client::open(url)?).await?;
    let cycles: Vec<Cycle> = OPS.iter().filter_map(|n| build(&client, n)).collect();
    for tasks in [1usize, 64] {
        let samples = measure_rounds(&mut probe, &cycles, tasks, timing, rounds).await?;
        let medians = median_rates(&samples);
        for ((name, s), r) in OPS.iter().zip(&samples).zip(&medians) {
            println!("macro tasks={tasks} {name}_calls_per_s {r:.0}");
            println!(
                "macro tasks={tasks} {name}_calls_per_s_rounds {}",
                crate::measure::rounds_list(rates(s))
            );
        }
        let name = format!("macro_vs_by_hand_{tasks}_tasks");
        let f = Figure::rounds(name, "calls/s", &rates(&samples[1]), &rates(&samples[0]));
        println!("{}", f.ratio_line());
        figures.push(f.target(0.95));
    }
    Ok(figures)
}
