//! `scripts/bench ratelimit`: GCRA decisions per second against the floor (EVALSHA of a
//! trivial one-key script on the same kind of connection), interleaved rounds, medians.

use lock_core::{LockClient, RateLimit};
use redis::aio::ConnectionManager;

use crate::measure::{
    BoxError, Cycle, Timing, cycle, measure_rounds, median, median_rates, rounds_list,
};
use crate::report::Figure;

const TRIVIAL: &str = "#!lua\nreturn redis.call('EXISTS', KEYS[1])";

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let client = LockClient::open(url).await?;
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let mut probe = conn.clone();
    let script = std::sync::Arc::new(redis::Script::new(TRIVIAL));
    // Generous enough that most decisions are "allowed" (the common case).
    let limiter = client.rate_limiter("bench", RateLimit::per_second(1_000_000));
    let impls: [(&str, Cycle); 2] = [
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
    println!(
        "ratio ratelimit_ours_vs_floor_{tasks}_tasks {:.2}",
        rates[1] / rates[0]
    );
    Ok(vec![
        Figure::vs(
            format!("ratelimit_ours_vs_floor_{tasks}_tasks"),
            rates[1],
            rates[0],
            "decisions/s",
        )
        .target(0.9),
    ])
}
