//! `scripts/bench ids`: order ids per second in one process, one script call per id
//! (`IdMode::PerId`) against blocks handed out locally (`IdMode::Segment`, default block
//! of 10 000), 64 tasks each, interleaved rounds, medians.
//!
//! Prints `ids per_id_ids_per_s X`, `ids segment_ids_per_s Y`, each implementation's
//! per-round rates and CPU per id, and `ratio segment_vs_per_id Y/X` (target: at least
//! 20, with at least 2 million ids/s in segment mode).

use lock_core::LockClient;
use lock_core::ids::{IdConfig, IdGenerator, IdMode};
use redis::aio::ConnectionManager;

use crate::measure::{
    BoxError, Cycle, Timing, check_all, cycle, measure_rounds, median, median_rates, rounds_list,
};
use crate::report::{Figure, ratio_text};

/// Tasks taking ids at once.
const TASKS: usize = 64;
/// Implementations measured.
pub const MEASUREMENTS: usize = 2;

fn next_ids(ids: IdGenerator) -> Cycle {
    cycle(move |_, _| {
        let ids = ids.clone();
        async move {
            ids.next_id().await?;
            Ok(())
        }
    })
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let client = LockClient::open(url).await?;
    let mut probe = ConnectionManager::new(redis::Client::open(url)?).await?;
    let per_id = IdGenerator::new(&client, "bench-ids", IdConfig::new())?;
    let segment = IdGenerator::new(
        &client,
        "bench-ids",
        IdConfig::new().with_mode(IdMode::segment()),
    )?;
    let impls: [(&str, Cycle); MEASUREMENTS] =
        [("per_id", next_ids(per_id)), ("segment", next_ids(segment))];
    let cycles: Vec<Cycle> = impls.iter().map(|(_, c)| c.clone()).collect();
    let samples = measure_rounds(&mut probe, &cycles, TASKS, timing, rounds).await?;
    let rates = median_rates(&samples);
    for ((name, _), (s, r)) in impls.iter().zip(samples.iter().zip(&rates)) {
        println!("ids {name}_ids_per_s {r:.0}");
        println!(
            "ids {name}_ids_per_s_rounds {}",
            rounds_list(s.iter().map(|s| s.cycles_per_s))
        );
        println!(
            "ids {name}_cpu_us_per_id redis {:.3} client {:.3}",
            median(s.iter().map(|s| s.redis_us)),
            median(s.iter().map(|s| s.client_us))
        );
    }
    let names: Vec<&str> = impls.iter().map(|(n, _)| *n).collect();
    let spreads = check_all("ids", &names, &samples);
    println!(
        "ratio segment_vs_per_id {}",
        ratio_text(rates[1], rates[0], [spreads[1], spreads[0]])
    );
    Ok(vec![
        Figure::between("segment_vs_per_id", (1, 0), &rates, &spreads, "ids/s").target(20.0),
    ])
}
