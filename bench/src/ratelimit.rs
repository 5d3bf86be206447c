//! `scripts/bench ratelimit`: GCRA decisions per second against the floor (EVALSHA of a
//! trivial one-key script on the same kind of connection) and a redis_rate-style
//! script, interleaved rounds, judged on the per-round ratios.

use std::sync::Arc;

use lock_core::{LockClient, LockConfig, RateLimit};
use redis::aio::ConnectionManager;

use crate::figure::Figure;
use crate::measure::{
    BoxError, Cycle, Timing, cycle, measure_rounds, median, median_rates, rates, rounds_list,
};

const TRIVIAL: &str = "#!lua\nreturn redis.call('EXISTS', KEYS[1])";

/// The peer: GCRA the way go-redis `redis_rate` (v10, `allowN`) computes it, written
/// here from its description: the same commands (TIME, GET, SET EX), seconds as a
/// float since 2017-01-01, burst/rate/period/cost arguments and a 4-value reply with
/// two values as strings. Issued raw with EVALSHA on the same kind of connection.
const REDIS_RATE_STYLE: &str = r#"
redis.replicate_commands()
local key = KEYS[1]
local burst, rate, period = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interval = period / rate
local t = redis.call("TIME")
local now = (t[1] - 1483228800) + (t[2] / 1000000)
local tat = tonumber(redis.call("GET", key)) or now
if tat < now then tat = now end
local new_tat = tat + interval * cost
local diff = now - (new_tat - interval * burst)
if diff < 0 then
  return {0, 0, tostring(-diff), tostring(tat - now)}
end
local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", key, new_tat, "EX", math.ceil(reset_after))
end
return {cost, diff / interval, tostring(-1), tostring(reset_after)}
"#;

/// The implementations, in measuring order: the names of the rate lines and of
/// `lock-bench ops ratelimit.<name>`.
pub const OPS: [&str; 4] = ["floor", "ours", "redis_rate", "ours_unbatched"];

/// Implementation `name` on `url` (`conn` for the raw scripts); `None` for an unknown
/// name.
async fn build(url: &str, conn: &ConnectionManager, name: &str) -> Result<Option<Cycle>, BoxError> {
    // Generous enough that most decisions are "allowed" (the common case).
    let limit = RateLimit::per_second(1_000_000);
    Ok(Some(match name {
        "floor" => {
            let (conn, script) = (conn.clone(), Arc::new(redis::Script::new(TRIVIAL)));
            cycle(move |t, _| {
                let (mut conn, script) = (conn.clone(), script.clone());
                async move {
                    let _: i64 = script
                        .key(format!("bench:floor:{t}"))
                        .invoke_async(&mut conn)
                        .await?;
                    Ok(())
                }
            })
        }
        "redis_rate" => {
            let (conn, peer) = (conn.clone(), Arc::new(redis::Script::new(REDIS_RATE_STYLE)));
            cycle(move |t, _| {
                let (mut conn, peer) = (conn.clone(), peer.clone());
                async move {
                    let _: (i64, redis::Value, String, String) = peer
                        .key(format!("bench:redis_rate:{t}"))
                        .arg(1_000_000)
                        .arg(1_000_000)
                        .arg(1)
                        .arg(1)
                        .invoke_async(&mut conn)
                        .await?;
                    Ok(())
                }
            })
        }
        "ours" | "ours_unbatched" => {
            let config = LockConfig::new().with_batching(name == "ours");
            let prefix = if name == "ours" {
                "bench"
            } else {
                "bench-unbatched"
            };
            let limiter = LockClient::open_with_config(url, config)
                .await?
                .rate_limiter(prefix, limit);
            cycle(move |t, _| {
                let limiter = limiter.clone();
                async move {
                    limiter.check(("user", t)).await?;
                    Ok(())
                }
            })
        }
        _ => return Ok(None),
    }))
}

/// Implementation `name`'s cycle on `url`, for `lock-bench ops`; `None` for an unknown
/// name.
pub async fn op(url: &str, name: &str) -> Result<Option<Cycle>, BoxError> {
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    build(url, &conn, name).await
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let mut probe = conn.clone();
    let mut cycles = Vec::new();
    for name in OPS {
        cycles.extend(build(url, &conn, name).await?);
    }
    let tasks = 64;
    let samples = measure_rounds(&mut probe, &cycles, tasks, timing, rounds).await?;
    let medians = median_rates(&samples);
    for ((name, s), r) in OPS.iter().zip(&samples).zip(&medians) {
        println!(
            "ratelimit tasks={tasks} {name}_cpu_us_per_decision redis {:.1} client {:.1}",
            median(s.iter().map(|s| s.server_us)),
            median(s.iter().map(|s| s.client_us))
        );
        println!("ratelimit tasks={tasks} {name}_decisions_per_s {r:.0}");
        println!(
            "ratelimit tasks={tasks} {name}_decisions_per_s_rounds {}",
            rounds_list(rates(s))
        );
    }
    let mut figures = Vec::new();
    for (name, a, b, target) in [
        ("ours_vs_floor", 1, 0, Some(0.9)),
        ("ours_vs_redis_rate", 1, 2, Some(1.3)),
        ("ours_unbatched_vs_redis_rate", 3, 2, None),
    ] {
        let name = format!("ratelimit_{name}_{tasks}_tasks");
        let f = Figure::rounds(
            name,
            "decisions/s",
            &rates(&samples[a]),
            &rates(&samples[b]),
        );
        println!("{}", f.ratio_line());
        figures.push(match target {
            Some(t) => f.target(t),
            None => f,
        });
    }
    Ok(figures)
}
