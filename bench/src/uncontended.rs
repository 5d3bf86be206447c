//! Uncontended lock/unlock cycles: every task on its own key, so each cycle is one
//! acquire and one release with nobody waiting.

use std::sync::Arc;
use std::time::Duration;

use lock_core::{Lease, LockClient, LockOptions};
use redis::aio::ConnectionManager;

use crate::measure::{
    BoxError, Cycle, Timing, cycle, measure_rounds, median, median_rates, rounds_list,
};
use crate::report::Figure;

/// Concurrencies measured: tasks running cycles at the same time.
const CONCURRENCIES: [usize; 2] = [1, 64];

/// Same compare-and-delete as the usual Redis lock recipe, for the floor's release.
const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

/// One implementation under test.
struct Impl {
    /// Name in the `<name>_cpu_us_per_cycle` line.
    name: &'static str,
    /// Name in the `<name>_cycles_per_s` line.
    rate_name: &'static str,
    cycle: Cycle,
}

/// Indices into [`impls`]'s result, in measuring order of round 1.
const FLOOR: usize = 0;
const RAW: usize = 1;
const OURS: usize = 2;
const WATCHDOG: usize = 3;
const RSLOCK: usize = 4;
const UNBATCHED: usize = 5;

fn lua_source(name: &str) -> Result<&'static str, BoxError> {
    lock_core::SCRIPT_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .ok_or_else(|| format!("no script {name}").into())
}

/// The implementations, indexed by [`FLOOR`], [`RAW`], [`OURS`], [`WATCHDOG`], [`RSLOCK`],
/// [`UNBATCHED`].
async fn impls(url: &str, conn: &ConnectionManager) -> Result<[Impl; 6], BoxError> {
    let client = LockClient::open(url).await?;
    let unbatched_client =
        LockClient::open_with_config(url, lock_core::LockConfig::new().with_batching(false))
            .await?;
    let rslock = rslock::LockManager::new(vec![url.to_string()]);
    let fixed = LockOptions::new()
        .lease(Lease::Fixed(Duration::from_secs(10)))
        .wait(Duration::ZERO);
    // The usual recipe: SET NX PX, then compare-and-delete.
    let floor = {
        let (conn, script) = (
            conn.clone(),
            Arc::new(redis::Script::new(COMPARE_AND_DELETE)),
        );
        cycle(move |t, n| {
            let (mut conn, script) = (conn.clone(), script.clone());
            async move {
                let key = format!("bench:floor:{t}");
                let token = format!("{t}:{n}");
                let ok: Option<String> = redis::cmd("SET")
                    .arg(&key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(10_000)
                    .query_async(&mut conn)
                    .await?;
                ok.ok_or("floor: key was taken")?;
                let _: i64 = script.key(&key).arg(&token).invoke_async(&mut conn).await?;
                Ok(())
            }
        })
    };
    // The floor for our semantics: lock-core's own scripts issued raw, so the gap to
    // `ours` is the library's overhead and the gap to `floor` is the scripts' cost.
    let raw = {
        let acquire = Arc::new(redis::Script::new(lua_source("acquire.lua")?));
        let release = Arc::new(redis::Script::new(lua_source("release.lua")?));
        let conn = conn.clone();
        cycle(move |t, n| {
            let (mut conn, acquire, release) = (conn.clone(), acquire.clone(), release.clone());
            async move {
                let key = format!("lock:{{bench:raw:{t}}}");
                let value = format!("0123456789abcdef0123456789abcdef:{t}:{n}");
                let granted: Vec<Vec<i64>> = acquire
                    .key(&key)
                    .key("lock:fence:{0}")
                    .key(format!("{key}:waiters"))
                    .arg(&value)
                    .arg(10_000)
                    .arg(0)
                    .arg(0)
                    .invoke_async(&mut conn)
                    .await?;
                let granted: Vec<i64> = granted.into_iter().next().unwrap_or_default();
                if granted.first() != Some(&1) {
                    return Err("raw scripts: lock was taken".into());
                }
                let _: Vec<Vec<i64>> = release
                    .key(&key)
                    .key(format!("{key}:waiters"))
                    .key(format!("{key}:released"))
                    .arg(&value)
                    .arg("x")
                    .invoke_async(&mut conn)
                    .await?;
                Ok(())
            }
        })
    };
    let unbatched = {
        let fixed = fixed.clone();
        cycle(move |t, _| {
            let (client, fixed) = (unbatched_client.clone(), fixed.clone());
            async move {
                let g = client.acquire(("bench", "unbatched", t), fixed).await?;
                g.release().await?;
                Ok(())
            }
        })
    };
    let ours = {
        let client = client.clone();
        cycle(move |t, _| {
            let (client, fixed) = (client.clone(), fixed.clone());
            async move {
                let g = client.acquire(("bench", "ours", t), fixed).await?;
                g.release().await?;
                Ok(())
            }
        })
    };
    let watchdog = cycle(move |t, _| {
        let client = client.clone();
        async move {
            let g = client.try_lock(("bench", "watchdog", t)).await?;
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
    let named = |name, rate_name, cycle| Impl {
        name,
        rate_name,
        cycle,
    };
    Ok([
        named("floor", "floor", floor),
        named("our_scripts_raw", "our_scripts_raw", raw),
        named("ours", "ours_fixed_lease", ours),
        named("ours_watchdog", "ours_watchdog", watchdog),
        named("rslock", "rslock", peer),
        named("ours_unbatched", "ours_unbatched", unbatched),
    ])
}

/// Measures every implementation at 1 and 64 tasks, `rounds` interleaved rounds each;
/// prints the medians, the per-round rates (and a `disturbed` line for an
/// implementation whose rounds spread more than the bound) and the ratios of the
/// medians. Every figure from a disturbed implementation is marked so.
pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    use crate::measure::{check_rounds, round_spread};
    use crate::report::ratio_text;

    let mut figures = Vec::new();
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let impls = impls(url, &conn).await?;
    let mut probe = conn.clone();
    for tasks in CONCURRENCIES {
        let cycles: Vec<Cycle> = impls.iter().map(|imp| imp.cycle.clone()).collect();
        let samples = measure_rounds(&mut probe, &cycles, tasks, timing, rounds).await?;
        let rates = median_rates(&samples);
        let mut spreads = vec![None; impls.len()];
        for (((imp, s), rate), spread) in impls
            .iter()
            .zip(&samples)
            .zip(rates.iter().copied())
            .zip(&mut spreads)
        {
            println!(
                "uncontended tasks={tasks} {}_cpu_us_per_cycle redis {:.1} client {:.1}",
                imp.name,
                median(s.iter().map(|s| s.redis_us)),
                median(s.iter().map(|s| s.client_us)),
            );
            println!(
                "uncontended tasks={tasks} {}_cycles_per_s {rate:.0}",
                imp.rate_name
            );
            println!(
                "uncontended tasks={tasks} {}_cycles_per_s_rounds {}",
                imp.rate_name,
                rounds_list(s.iter().map(|s| s.cycles_per_s))
            );
            *spread = check_rounds(
                &format!("uncontended_tasks={tasks}"),
                imp.rate_name,
                round_spread(s),
            );
        }
        let ratio = |name: &str, a: usize, b: usize| {
            println!(
                "ratio {name}_{tasks}_tasks {}",
                ratio_text(rates[a], rates[b], [spreads[a], spreads[b]])
            );
        };
        ratio("ours_vs_floor", OURS, FLOOR);
        ratio("ours_vs_our_scripts_raw", OURS, RAW);
        ratio("our_scripts_raw_vs_floor", RAW, FLOOR);
        ratio("ours_watchdog_vs_floor", WATCHDOG, FLOOR);
        ratio("ours_vs_rslock", OURS, RSLOCK);
        ratio("ours_unbatched_vs_floor", UNBATCHED, FLOOR);
        ratio("ours_vs_ours_unbatched", OURS, UNBATCHED);
        let unit = "cycles/s";
        let figure = |name: &str, a: usize, b: usize| {
            Figure::vs(format!("{name}_{tasks}_tasks"), rates[a], rates[b], unit)
                .disturbed_by(spreads[a])
                .disturbed_by(spreads[b])
        };
        // Batching: >= 1.5x the recipe and >= 2x rslock under load, >= 0.95x alone.
        let (vs_floor, vs_rslock) = if tasks == 1 { (0.95, 1.0) } else { (1.5, 2.0) };
        figures.push(figure("ours_vs_floor", OURS, FLOOR).target(vs_floor));
        figures.push(figure("ours_watchdog_vs_floor", WATCHDOG, FLOOR));
        figures.push(figure("ours_vs_rslock", OURS, RSLOCK).target(vs_rslock));
        figures.push(figure("ours_unbatched_vs_floor", UNBATCHED, FLOOR));
    }
    Ok(figures)
}
