//! `scripts/bench ids`: order ids per second in one process, one script call per id
//! (`IdMode::PerId`) against blocks handed out locally (`IdMode::Segment`, default block
//! of 10 000), 64 tasks each, interleaved rounds, judged on the per-round ratio.
//!
//! Prints `ids per_id_ids_per_s X`, `ids segment_ids_per_s Y`, each implementation's
//! per-round rates and CPU per id, and `ratio segment_vs_per_id` (the median of the
//! per-round Y/X; target: at least 20, with at least 2 million ids/s in segment mode).

use lock_core::LockClient;
use lock_core::ids::{IdConfig, IdGenerator, IdMode};
use redis::aio::ConnectionManager;

use crate::figure::Figure;
use crate::measure::{
    BoxError, Cycle, Timing, cycle, measure_rounds, median, median_rates, rates, rounds_list,
};

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

/// The implementations, in measuring order: the names of the rate lines and of
/// `lock-bench ops ids.<name>`.
pub const OPS: [&str; MEASUREMENTS] = ["per_id", "segment"];

/// Implementation `name` on `client`; `None` for an unknown name.
fn build(client: &LockClient, name: &str) -> Result<Option<Cycle>, BoxError> {
    let mode = match name {
        "per_id" => IdConfig::new(),
        "segment" => IdConfig::new().with_mode(IdMode::segment()),
        _ => return Ok(None),
    };
    Ok(Some(next_ids(IdGenerator::new(client, "bench-ids", mode)?)))
}

/// Implementation `name`'s cycle on `url`, for `lock-bench ops`; `None` for an unknown
/// name.
pub async fn op(url: &str, name: &str) -> Result<Option<Cycle>, BoxError> {
    if !OPS.contains(&name) {
        return Ok(None);
    }
    build(&LockClient::open(url).await?, name)
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let client = LockClient::open(url).await?;
    let mut probe = ConnectionManager::new(redis::Client::open(url)?).await?;
    let mut cycles = Vec::new();
    for name in OPS {
        cycles.extend(build(&client, name)?);
    }
    let samples = measure_rounds(&mut probe, &cycles, TASKS, timing, rounds).await?;
    let medians = median_rates(&samples);
    for ((name, s), r) in OPS.iter().zip(&samples).zip(&medians) {
        println!("ids {name}_ids_per_s {r:.0}");
        println!("ids {name}_ids_per_s_rounds {}", rounds_list(rates(s)));
        println!(
            "ids {name}_cpu_us_per_id redis {:.3} client {:.3}",
            median(s.iter().map(|s| s.server_us)),
            median(s.iter().map(|s| s.client_us))
        );
    }
    let f = Figure::rounds(
        "segment_vs_per_id",
        "ids/s",
        &rates(&samples[1]),
        &rates(&samples[0]),
    );
    println!("{}", f.ratio_line());
    Ok(vec![f.target(20.0)])
}
