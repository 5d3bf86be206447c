//! Instructions per order request of the flash sale, counted by callgrind: the
//! instruction columns of `seckill_requests_per_s_vs_floor` (`scripts/bench
//! instructions seckill`, and `all`).
//!
//! One `seckill-server` instance, ours or the floor (`--floor`), on a fresh
//! redis-server and SQLite file, serves [`SALES`] sales of [`CONFIG`], then twice as
//! many. [`CONFIG`] is a tenth of the rates benchmark's sale with the same ratio of
//! buyers to units, so the same mix of sold and refused orders. The service side counts
//! the instance under callgrind (stopped by SIGTERM, so callgrind writes its file),
//! with Redis native; the Redis side counts the redis-server under callgrind, with the
//! instance native. The difference of two counts over the difference of the order
//! requests made is one request. A sale's own calls (creating the voucher, waiting for
//! the queue to drain, reading the orders back) are spread over its requests, the same
//! on both sides. The load generator runs in this process and is not counted.

use std::path::Path;
use std::time::Duration;

use lock_examples::seckill::instances::{Instance, server_binary};
use lock_examples::seckill::load::{self, LoadConfig};
use lock_tests::RedisServer;

use crate::callgrind::{CountedRedis, Scratch, totals_of, wrapper};
use crate::figure::PerOp;
use crate::measure::BoxError;
use crate::report::number;

/// The implementations counted here, as the instruction pairs name them.
pub const OURS: &str = "seckill.ours";
pub const FLOOR: &str = "seckill.floor";

/// One sale: 200 buyers for 10 units, the demo's 20 buyers per unit.
pub const CONFIG: LoadConfig = LoadConfig {
    buyers: 200,
    stock: 10,
};

/// Sales in the shorter run (the longer runs twice as many).
pub const SALES: u64 = 10;

/// How long an instance under callgrind gets to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// What one run counted: instructions on the counted side, and the order requests the
/// sales made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    instructions: u64,
    requests: u64,
}

/// One request's instructions from a run of `short` and a longer one; `None` when the
/// longer run counted no more instructions or made no more requests.
fn per_request(short: Run, long: Run) -> Option<f64> {
    (long.instructions > short.instructions && long.requests > short.requests).then(|| {
        (long.instructions - short.instructions) as f64 / (long.requests - short.requests) as f64
    })
}

fn flags(floor: bool) -> Vec<&'static str> {
    let mut flags = vec!["--allow-volatile-redis"];
    if floor {
        flags.push("--floor");
    }
    flags
}

/// `n` sales against `url`; the order requests they made. Ours must pass the sale's
/// verdict (the floor, without idempotency or rate limit, is not judged).
async fn sales(url: &str, n: u64, floor: bool) -> Result<u64, BoxError> {
    let urls = [url.to_string()];
    let mut requests = 0;
    for _ in 0..n {
        let v = load::run(CONFIG, &urls).await?;
        if !floor && !v.violations().is_empty() {
            return Err(format!("the seckill verdict failed under callgrind:\n{v}").into());
        }
        requests += v.requests as u64;
    }
    Ok(requests)
}

/// The instance under callgrind, Redis native.
async fn service_side(scratch: &Scratch, tag: &str, floor: bool, n: u64) -> Result<Run, BoxError> {
    let redis = tokio::task::spawn_blocking(RedisServer::start).await?;
    let (args, out) = wrapper(scratch, tag);
    let db = scratch.file(&format!("{tag}.db"));
    let mut instance = Instance::spawn_under(
        Some((Path::new("valgrind"), &args)),
        &server_binary()?,
        &redis.url(),
        &db,
        &flags(floor),
    )
    .await?;
    let requests = sales(&instance.url, n, floor).await?;
    instance.terminate(STOP_TIMEOUT).await?;
    Ok(Run {
        instructions: totals_of(&out)?,
        requests,
    })
}

/// The redis-server under callgrind, the instance native.
async fn redis_side(scratch: &Scratch, tag: &str, floor: bool, n: u64) -> Result<Run, BoxError> {
    let redis = CountedRedis::start(scratch, tag).await?;
    let db = scratch.file(&format!("{tag}.db"));
    let mut instance = Instance::spawn(&server_binary()?, &redis.url(), &db, &flags(floor)).await?;
    let requests = sales(&instance.url, n, floor).await?;
    instance.terminate(STOP_TIMEOUT).await?;
    Ok(Run {
        instructions: redis.finish().await?,
        requests,
    })
}

/// `x.xk (10 sales, a requests: c; 20 sales, b requests: d)`, or why there is no figure.
fn side_text(per: Option<f64>, [short, long]: [Run; 2]) -> String {
    let counts = format!(
        "{SALES} sales, {} requests: {}; {} sales, {} requests: {}",
        short.requests,
        short.instructions,
        2 * SALES,
        long.requests,
        long.instructions
    );
    match per {
        Some(p) => format!("{} ({counts})", number(p)),
        None => format!("not measured, the longer run counted no more ({counts})"),
    }
}

/// Instructions per order request of [`OURS`] or, with `floor`, [`FLOOR`] on the
/// service's side (the `client` of [`PerOp`]) and Redis's; prints one line.
pub async fn measure(scratch: &Scratch, floor: bool) -> Result<PerOp, BoxError> {
    let imp = if floor { FLOOR } else { OURS };
    let mut service = [Run {
        instructions: 0,
        requests: 0,
    }; 2];
    let mut redis = service;
    for (i, n) in [SALES, 2 * SALES].into_iter().enumerate() {
        let tag = format!("{imp}-{n}");
        service[i] = service_side(scratch, &format!("{tag}-service"), floor, n).await?;
        redis[i] = redis_side(scratch, &format!("{tag}-redis"), floor, n).await?;
    }
    let per = PerOp {
        client: per_request(service[0], service[1]),
        server: per_request(redis[0], redis[1]),
    };
    println!(
        "instructions {imp} buyers={} units={} per order request: service {} redis {}",
        CONFIG.buyers,
        CONFIG.stock,
        side_text(per.client, service),
        side_text(per.server, redis),
    );
    Ok(per)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difference_over_the_extra_requests() {
        let run = |instructions, requests| Run {
            instructions,
            requests,
        };
        // Start-up 90M, 400k per request: 2800 requests, then 5550.
        let short = run(90_000_000 + 2800 * 400_000, 2800);
        let long = run(90_000_000 + 5550 * 400_000, 5550);
        assert_eq!(per_request(short, long), Some(400_000.0));
        assert_eq!(per_request(long, short), None);
        assert_eq!(per_request(short, run(long.instructions, 2800)), None);
    }
}
