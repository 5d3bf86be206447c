//! Uncontended lock/unlock cycles: every task on its own key, so each cycle is one
//! acquire and one release with nobody waiting.

use std::sync::Arc;

use std::time::Duration;

use lock_core::{Lease, LockClient, LockOptions};
use redis::aio::ConnectionManager;

use crate::figure::Figure;
use crate::measure::{
    BoxError, Cycle, Sample, Timing, cycle, fixed_lease_cycle, latency_rounds, measure_rounds,
    median, rate, rates, round_order, rounds_list, rslock_cycle,
};

/// Concurrencies measured: tasks running cycles at the same time.
const CONCURRENCIES: [usize; 2] = [1, 64];
/// Tasks of the one-thread figure ([`one_thread`]).
const ONE_THREAD_TASKS: usize = 64;

/// Same compare-and-delete as the usual Redis lock recipe, for the floor's release.
const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

/// The implementations, in measuring order of round 1: the name in the
/// `<name>_cpu_us_per_cycle` line (and in `lock-bench ops lock.<name>`), and in the
/// `<name>_cycles_per_s` line.
const IMPLS: [(&str, &str); 7] = [
    ("floor", "floor"),
    ("our_scripts_raw", "our_scripts_raw"),
    ("ours", "ours_fixed_lease"),
    ("ours_watchdog", "ours_watchdog"),
    ("rslock", "rslock"),
    ("ours_unbatched", "ours_unbatched"),
    ("ours_read", "ours_read_hold"),
];

/// Indices into [`IMPLS`].
const FLOOR: usize = 0;
const RAW: usize = 1;
const OURS: usize = 2;
const WATCHDOG: usize = 3;
const RSLOCK: usize = 4;
const UNBATCHED: usize = 5;
const READ: usize = 6;

/// The names `lock-bench ops lock.<name>` takes.
pub fn op_names() -> impl Iterator<Item = &'static str> {
    IMPLS.iter().map(|(name, _)| *name)
}

/// Implementation `name`'s cycle on `url`, for `lock-bench ops`; `None` for an unknown
/// name.
pub async fn op(url: &str, name: &str) -> Result<Option<Cycle>, BoxError> {
    let Some(i) = IMPLS.iter().position(|(n, _)| *n == name) else {
        return Ok(None);
    };
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    Ok(Some(build(i, url, &conn).await?))
}

fn lua_source(name: &str) -> Result<&'static str, BoxError> {
    lock_core::SCRIPT_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .ok_or_else(|| format!("no script {name}").into())
}

/// Implementation `i` of [`IMPLS`], with a client of its own; `conn` is the
/// multiplexed connection the raw ones share.
async fn build(i: usize, url: &str, conn: &ConnectionManager) -> Result<Cycle, BoxError> {
    Ok(match i {
        FLOOR => floor(conn.clone()),
        RAW => raw(conn.clone())?,
        OURS | UNBATCHED => {
            let config = lock_core::LockConfig::new().with_batching(i == OURS);
            let client = LockClient::open_with_config(url, config).await?;
            let kind = if i == OURS { "ours" } else { "unbatched" };
            fixed_lease_cycle(client, kind)
        }
        READ => {
            // A read hold of a read-write lock, fixed lease: the shared hold's script
            // against the plain lock's SET NX PX.
            let client = LockClient::open(url).await?;
            let options = LockOptions::new()
                .read()
                .lease(Lease::Fixed(Duration::from_secs(10)))
                .wait(Duration::ZERO);
            cycle(move |t, _| {
                let (client, options) = (client.clone(), options.clone());
                async move {
                    let g = client.acquire(("bench", "read", t), options).await?;
                    g.release().await?;
                    Ok(())
                }
            })
        }
        WATCHDOG => {
            let client = LockClient::open(url).await?;
            cycle(move |t, _| {
                let client = client.clone();
                async move {
                    let g = client.try_lock(("bench", "watchdog", t)).await?;
                    g.release().await?;
                    Ok(())
                }
            })
        }
        _ => rslock_cycle(rslock::LockManager::new(vec![url.to_string()])),
    })
}

/// The usual recipe: SET NX PX, then compare-and-delete.
fn floor(conn: ConnectionManager) -> Cycle {
    let script = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
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
}

/// The floor for our semantics: lock-core's own scripts issued raw, so the gap to
/// `ours` is the library's overhead and the gap to `floor` is the scripts' cost.
fn raw(conn: ConnectionManager) -> Result<Cycle, BoxError> {
    let acquire = Arc::new(redis::Script::new(lua_source("acquire.lua")?));
    let release = Arc::new(redis::Script::new(lua_source("release.lua")?));
    Ok(cycle(move |t, n| {
        let (mut conn, acquire, release) = (conn.clone(), acquire.clone(), release.clone());
        async move {
            let key = format!("lock:{{bench:raw:{t}}}");
            let value = format!("0123456789abcdef0123456789abcdef:{t}:{n}");
            let granted: Vec<i64> = acquire
                .key(&key)
                .key("lock:fence:{0}")
                .key(format!("{key}:waiters"))
                .arg(&value)
                .arg(10_000)
                .arg(0)
                .arg(0)
                .invoke_async(&mut conn)
                .await?;
            if granted.first() != Some(&1) {
                return Err("raw scripts: lock was taken".into());
            }
            let _: i64 = release
                .key(&key)
                .key(format!("{key}:waiters"))
                .key(format!("{key}:queue"))
                .arg(&value)
                .invoke_async(&mut conn)
                .await?;
            Ok(())
        }
    }))
}

/// Prints one implementation's medians over its rounds `samples` at `tasks` tasks: CPU
/// per cycle under `name` (`server` names the server side), cycles per second and each
/// round's under `rate_name`.
pub fn print(tasks: usize, server: &str, name: &str, rate_name: &str, samples: &[Sample]) {
    println!(
        "uncontended tasks={tasks} {name}_cpu_us_per_cycle {server} {:.1} client {:.1}",
        median(samples.iter().map(|s| s.server_us)),
        median(samples.iter().map(|s| s.client_us)),
    );
    let rate = median(rates(samples));
    println!("uncontended tasks={tasks} {rate_name}_cycles_per_s {rate:.0}");
    println!(
        "uncontended tasks={tasks} {rate_name}_cycles_per_s_rounds {}",
        rounds_list(rates(samples))
    );
}

/// Measures every implementation at 1 and 64 tasks, `rounds` interleaved rounds each;
/// prints the medians, the per-round rates and each ratio's line (the median of the
/// per-round ratios, their spread, and a `disturbed` line when they disagree).
pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let mut figures = Vec::new();
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let mut cycles = Vec::with_capacity(IMPLS.len());
    for i in 0..IMPLS.len() {
        cycles.push(build(i, url, &conn).await?);
    }
    let mut probe = conn.clone();
    for tasks in CONCURRENCIES {
        let samples = measure_rounds(&mut probe, &cycles, tasks, timing, rounds).await?;
        for ((name, rate_name), s) in IMPLS.iter().zip(&samples) {
            print(tasks, "redis", name, rate_name, s);
        }
        let figure = |name: &str, a: usize, b: usize| {
            let name = format!("{name}_{tasks}_tasks");
            Figure::rounds(name, "cycles/s", &rates(&samples[a]), &rates(&samples[b]))
        };
        // The engine's targets (>= 1.0x the recipe and >= 1.2x rslock under load,
        // >= 0.95x alone, at most 1.15x the recipe's client instructions with either
        // lease), and the pipelining's under load (>= 1.3x the recipe, >= 1.5x rslock,
        // at most 0.7x the recipe's client instructions).
        let (vs_floor, vs_rslock, instructions): (&[f64], &[f64], &[f64]) = if tasks == 1 {
            (&[0.95], &[1.0], &[1.15])
        } else {
            (&[1.0, 1.3], &[1.2, 1.5], &[1.15, 0.7])
        };
        let table = [
            figure("ours_vs_floor", OURS, FLOOR)
                .targets(vs_floor)
                .instruction_targets(instructions),
            figure("ours_watchdog_vs_floor", WATCHDOG, FLOOR).instruction_targets(&[1.15]),
            figure("ours_vs_rslock", OURS, RSLOCK).targets(vs_rslock),
            figure("ours_unbatched_vs_floor", UNBATCHED, FLOOR),
            figure("ours_read_hold_vs_ours", READ, OURS),
        ];
        // Printed only: where the gap to the floor comes from.
        let printed = [
            figure("ours_vs_our_scripts_raw", OURS, RAW),
            figure("our_scripts_raw_vs_floor", RAW, FLOOR),
            figure("ours_vs_ours_unbatched", OURS, UNBATCHED),
        ];
        for f in table.iter().chain(&printed) {
            println!("{}", f.ratio_line());
        }
        figures.extend(table);
    }
    let lone = lone_cycle_p50(&cycles, timing, rounds).await?;
    println!("{}", lone.ratio_line());
    figures.push(lone);
    let one_thread = one_thread(url, timing, rounds).await?;
    println!("{}", one_thread.ratio_line());
    figures.push(one_thread);
    Ok(figures)
}

/// Ours and the floor at [`ONE_THREAD_TASKS`] tasks, each round on a one-thread tokio
/// runtime of its own (`#[tokio::main(flavor = "current_thread")]`), client made on
/// it: there the client's writes, its replies' handling and its callers share one
/// thread, so how a wave of calls is split into batches decides how much of it
/// overlaps with Redis's work. `rounds` interleaved rounds.
async fn one_thread(url: &str, timing: Timing, rounds: usize) -> Result<Figure, BoxError> {
    const MEASURED: [usize; 2] = [FLOOR, OURS];
    let mut samples: Vec<Vec<Sample>> = vec![Vec::with_capacity(rounds); MEASURED.len()];
    for round in 0..rounds {
        for i in round_order(MEASURED.len(), round) {
            let (url, name) = (url.to_owned(), IMPLS[MEASURED[i]].0);
            let (warm, measure) = (timing.warm(round), timing.measure);
            let sample = tokio::task::spawn_blocking(move || -> Result<Sample, BoxError> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async {
                    let cycle = op(&url, name).await?.ok_or("no such implementation")?;
                    let mut probe = ConnectionManager::new(redis::Client::open(url)?).await?;
                    rate(&mut probe, &cycle, ONE_THREAD_TASKS, warm, measure).await
                })
            })
            .await??;
            samples[i].push(sample);
        }
    }
    for (i, s) in MEASURED.iter().zip(&samples) {
        let (name, rate_name) = IMPLS[*i];
        let (name, rate_name) = (
            format!("{name}_one_thread"),
            format!("{rate_name}_one_thread"),
        );
        print(ONE_THREAD_TASKS, "redis", &name, &rate_name, s);
    }
    Ok(Figure::rounds(
        format!("ours_vs_floor_{ONE_THREAD_TASKS}_tasks_one_thread"),
        "cycles/s",
        &rates(&samples[1]),
        &rates(&samples[0]),
    ))
}

/// A lone call's latency with batching on and off: one task, every cycle (an
/// acquisition and a release) timed, `rounds` interleaved rounds; the figure is
/// unbatched's p50 over ours per round (target: ours within 5%, at least 0.95).
async fn lone_cycle_p50(
    cycles: &[Cycle],
    timing: Timing,
    rounds: usize,
) -> Result<Figure, BoxError> {
    let pair = [OURS, UNBATCHED];
    let lat = latency_rounds(&pair.map(|i| &cycles[i]), timing, rounds).await?;
    let p50: Vec<Vec<f64>> = lat
        .iter()
        .map(|l| l.iter().map(|x| x.0).collect())
        .collect();
    for (i, list) in p50.iter().enumerate() {
        println!(
            "uncontended tasks=1 {}_cycle_p50_us {:.0} rounds {}",
            IMPLS[pair[i]].0,
            median(list.iter().copied()),
            rounds_list(list.iter().copied())
        );
    }
    Ok(
        Figure::lower_is_better("lone_cycle_p50_ours_vs_unbatched", "us", &p50[0], &p50[1])
            .target(0.95),
    )
}
