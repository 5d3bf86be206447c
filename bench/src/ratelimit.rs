//! `scripts/bench ratelimit`: GCRA decisions per second against the floor (EVALSHA of a
//! trivial one-key script on the same kind of connection), interleaved rounds, medians.

use lock_core::{LockClient, RateLimit};
use redis::aio::ConnectionManager;

use crate::measure::{
    BoxError, Cycle, Timing, check_all, cycle, measure_rounds, median, median_rates, rounds_list,
};
use crate::report::{Figure, ratio_text};

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

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let client = LockClient::open(url).await?;
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let mut probe = conn.clone();
    let script = std::sync::Arc::new(redis::Script::new(TRIVIAL));
    // Generous enough that most decisions are "allowed" (the common case).
    let limiter = client.rate_limiter("bench", RateLimit::per_second(1_000_000));
    let unbatched = lock_core::LockClient::open_with_config(
        url,
        lock_core::LockConfig::new().with_batching(false),
    )
    .await?
    .rate_limiter("bench-unbatched", RateLimit::per_second(1_000_000));
    let peer = std::sync::Arc::new(redis::Script::new(REDIS_RATE_STYLE));
    let impls: [(&str, Cycle); 4] = [
        ("floor", {
            let (conn, script) = (conn.clone(), script.clone());
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
        }),
        ("ours", {
            let limiter = limiter.clone();
            cycle(move |t, _| {
                let limiter = limiter.clone();
                async move {
                    limiter.check(("user", t)).await?;
                    Ok(())
                }
            })
        }),
        ("redis_rate", {
            let (conn, peer) = (conn.clone(), peer.clone());
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
        }),
        ("ours_unbatched", {
            cycle(move |t, _| {
                let limiter = unbatched.clone();
                async move {
                    limiter.check(("user", t)).await?;
                    Ok(())
                }
            })
        }),
    ];
    let tasks = 64;
    let cycles: Vec<Cycle> = impls.iter().map(|(_, c)| c.clone()).collect();
    let samples = measure_rounds(&mut probe, &cycles, tasks, timing, rounds).await?;
    let rates = median_rates(&samples);
    for ((name, _), (s, r)) in impls.iter().zip(samples.iter().zip(&rates)) {
        println!(
            "ratelimit tasks={tasks} {name}_cpu_us_per_decision redis {:.1} client {:.1}",
            median(s.iter().map(|s| s.redis_us)),
            median(s.iter().map(|s| s.client_us))
        );
        println!("ratelimit tasks={tasks} {name}_decisions_per_s {r:.0}");
        println!(
            "ratelimit tasks={tasks} {name}_decisions_per_s_rounds {}",
            rounds_list(s.iter().map(|s| s.cycles_per_s))
        );
    }
    let names: Vec<&str> = impls.iter().map(|(n, _)| *n).collect();
    let spreads = check_all(&format!("ratelimit_tasks={tasks}"), &names, &samples);
    let mut figures = Vec::new();
    for (name, a, b, target) in [
        ("ours_vs_floor", 1, 0, Some(0.9)),
        ("ours_vs_redis_rate", 1, 2, Some(1.5)),
        ("ours_unbatched_vs_redis_rate", 3, 2, None),
    ] {
        println!(
            "ratio ratelimit_{name}_{tasks}_tasks {}",
            ratio_text(rates[a], rates[b], [spreads[a], spreads[b]])
        );
        let name = format!("ratelimit_{name}_{tasks}_tasks");
        let f = Figure::between(name, (a, b), &rates, &spreads, "decisions/s");
        figures.push(match target {
            Some(t) => f.target(t),
            None => f,
        });
    }
    Ok(figures)
}
