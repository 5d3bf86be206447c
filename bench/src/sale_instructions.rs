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
//! on both sides. The load generator runs in this process for those two counts; a
//! third counts it alone (`seckill-load --sales N` under callgrind, the instance and
//! Redis native), for [`instruction_ratio`]: the sale's three processes summed.

use std::path::Path;
use std::time::Duration;

use lock_examples::seckill::instances::{Instance, load_binary, server_binary};
use lock_examples::seckill::load::{self, LoadConfig};
use lock_tests::RedisServer;

use crate::callgrind::{CountedRedis, Scratch, count_accepting, totals_of, wrapper};
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
        if v.requests != CONFIG.requests() {
            return Err(format!(
                "a sale made {} order requests, not the {} its size gives: the load \
                 generator's count would be off",
                v.requests,
                CONFIG.requests()
            )
            .into());
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

/// The load generator under callgrind (`seckill-load --sales n`), the instance and Redis
/// native. Against the floor its verdict fails (no idempotency, no rate limit): exit
/// status 1 is taken there as a run that was made.
async fn load_side(scratch: &Scratch, tag: &str, floor: bool, n: u64) -> Result<Run, BoxError> {
    let redis = tokio::task::spawn_blocking(RedisServer::start).await?;
    let db = scratch.file(&format!("{tag}.db"));
    let mut instance = Instance::spawn(&server_binary()?, &redis.url(), &db, &flags(floor)).await?;
    let args: Vec<String> = [
        "--buyers",
        &CONFIG.buyers.to_string(),
        "--stock",
        &CONFIG.stock.to_string(),
        "--sales",
        &n.to_string(),
        "--targets",
        &instance.url,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let counted = count_accepting(scratch, tag, &load_binary()?, &args, |code| {
        floor && code == 1
    })
    .await;
    instance.terminate(STOP_TIMEOUT).await?;
    Ok(Run {
        instructions: counted?,
        requests: n * CONFIG.requests() as u64,
    })
}

/// What one sale side costs per order request: the load generator, the service and
/// Redis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sale {
    pub load: Option<f64>,
    pub per: PerOp,
}

impl Sale {
    fn total(&self) -> Option<f64> {
        Some(self.load? + self.per.client? + self.per.server?)
    }
}

/// The floor's instructions per order request over ours, all three processes summed:
/// the ratio of requests/s a sale that keeps the cores busy would read if user-space
/// instructions were all it spent. The kernel's work (connections, sockets), about the
/// same per request on both sides, is not counted, and lifts a measured ratio above it.
pub fn instruction_ratio(ours: &Sale, floor: &Sale) -> Option<f64> {
    Some(floor.total()? / ours.total()?)
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
/// service's side (the `client` of [`PerOp`]), Redis's and the load generator's; prints
/// one line.
pub async fn measure(scratch: &Scratch, floor: bool) -> Result<Sale, BoxError> {
    let imp = if floor { FLOOR } else { OURS };
    let mut service = [Run {
        instructions: 0,
        requests: 0,
    }; 2];
    let (mut redis, mut load) = (service, service);
    for (i, n) in [SALES, 2 * SALES].into_iter().enumerate() {
        let tag = format!("{imp}-{n}");
        service[i] = service_side(scratch, &format!("{tag}-service"), floor, n).await?;
        redis[i] = redis_side(scratch, &format!("{tag}-redis"), floor, n).await?;
        load[i] = load_side(scratch, &format!("{tag}-load"), floor, n).await?;
    }
    let sale = Sale {
        load: per_request(load[0], load[1]),
        per: PerOp {
            client: per_request(service[0], service[1]),
            server: per_request(redis[0], redis[1]),
        },
    };
    println!(
        "instructions {imp} buyers={} units={} per order request: service {} redis {} load generator {}",
        CONFIG.buyers,
        CONFIG.stock,
        side_text(sale.per.client, service),
        side_text(sale.per.server, redis),
        side_text(sale.load, load),
    );
    Ok(sale)
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

    #[test]
    fn instruction_ratio_sums_the_three_processes() {
        let sale = |load, client, server| Sale {
            load,
            per: PerOp { client, server },
        };
        let floor = sale(Some(90e3), Some(70e3), Some(60e3));
        let ours = sale(Some(90e3), Some(140e3), Some(150e3));
        // (90 + 70 + 60) / (90 + 140 + 150)
        let c = instruction_ratio(&ours, &floor).unwrap();
        assert!((c - 220.0 / 380.0).abs() < 1e-12, "{c}");
        // A side not measured leaves no ratio.
        assert_eq!(
            instruction_ratio(&sale(None, Some(1.0), Some(1.0)), &floor),
            None
        );
        assert_eq!(
            instruction_ratio(&ours, &sale(Some(1.0), Some(1.0), None)),
            None
        );
    }

    #[test]
    fn the_load_generators_count_is_of_the_requests_its_size_gives() {
        // 200 buyers: 4 greedy (10 each), 20 trying twice, 20 retrying, 156 once.
        assert_eq!(CONFIG.requests(), 4 * 10 + 20 * 2 + 20 * 2 + 156);
    }
}
