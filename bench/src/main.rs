//! `scripts/bench lock`: lock-core against the floor (the same work as raw Redis
//! commands on one multiplexed connection) and against the `rslock` crate, in one run,
//! on a redis-server this program starts itself.
//!
//! # What is measured
//!
//! * **Uncontended** (`uncontended tasks=N ...`, N = 1 and 64): every task locks and
//!   unlocks its own key as fast as it can. Implementations:
//!   - `floor`: `SET NX PX` plus an EVALSHA compare-and-delete, raw, on one
//!     multiplexed connection: the least any Redis lock can do;
//!   - `our_scripts_raw`: lock-core's own acquire/release Lua scripts issued raw the
//!     same way, i.e. our semantics without the library around them;
//!   - `ours` (`ours_fixed_lease_cycles_per_s`): `LockClient::acquire` with a fixed
//!     lease, then `release`;
//!   - `ours_watchdog`: `LockClient::try_lock` (watchdog-renewed lease), then `release`;
//!   - `rslock`: the `rslock` crate's `lock`/`unlock` on the same server.
//!
//!   Figures: `<impl>_cycles_per_s` (lock + unlock cycles per second, all tasks
//!   together), `<impl>_cpu_us_per_cycle redis A client B` (CPU microseconds per cycle
//!   spent by redis-server and by this process), `<impl>_cycles_per_s_rounds` (each
//!   round's rate, to judge the noise).
//! * **Hot key** (`hot_key <impl> ...`): 64 tasks on one key, so every release hands
//!   the lock over to a waiter; `ours_1_clients` and `ours_4_clients` share the tasks
//!   over 1 or 4 `LockClient`s, `rslock` retries on its own. Figures: `handoffs_per_s`,
//!   and `handoff_p50_us`/`handoff_p99_us`, the time from a holder's release to the
//!   next grant.
//!
//! # Rounds and medians
//!
//! redis-server and this program share the machine's cores, so one measurement is
//! noisy. Every implementation is therefore measured in `--rounds` interleaved rounds
//! (round 1 in the order above, each later round rotated by one, so no implementation
//! always runs first or right after the same one), each for `--seconds`. The printed
//! figures are the medians over the rounds (the CPU figures too, each separately);
//! the first round is preceded by a short warm-up, later rounds by a shorter one.
//!
//! # Reading the ratios
//!
//! `ratio <name> <value>` lines are computed from the medians; above 1 means the first
//! named side is faster.
//! * `ours_vs_floor_{N}_tasks`: what lock-core delivers compared to the bare recipe;
//! * `our_scripts_raw_vs_floor_{N}_tasks`: the cost of our scripts' semantics alone;
//! * `ours_vs_our_scripts_raw_{N}_tasks`: the library's own overhead (1.0 = none);
//! * `ours_watchdog_vs_floor_{N}_tasks`: as `ours_vs_floor`, with the watchdog lease;
//! * `ours_vs_rslock_{N}_tasks`: against the peer crate;
//! * `hot_handoffs_ours_{1_client,4_clients}_vs_rslock`: handoffs per second on the
//!   hot key against rslock;
//! * `hot_handoff_p50_ours_1_client_vs_rslock`: rslock's median handoff time over ours
//!   (above 1 = ours hands over faster).
//!
//! Options: `--seconds N` per measurement (default 2), `--rounds N` (default 3).

mod hot;
mod idempotency;
mod ids;
mod macro_bench;
mod measure;
mod ratelimit;
mod redlock;
mod uncontended;

use std::time::Duration;

use lock_tests::RedisServer;

use crate::measure::{BoxError, Timing};

const USAGE: &str =
    "usage: lock-bench [lock|macro|ratelimit|ids|idempotency|redlock] [--seconds N] [--rounds N]
  lock          lock-core against the floor and rslock (the default)
  macro         an #[cache_lock] fn against the same work by hand
  ratelimit     GCRA decisions against a trivial one-key script
  ids           order ids per second: one script call per id against segment mode
  idempotency   POSTs/s over HTTP behind IdempotencyLayer against the same Redis
                round trips by hand (fresh keys, and replays)
  redlock       a Redlock over 5 local masters against single-node locking and
                rslock over the same masters (latency p50/p99, throughput)
  --seconds N   measured seconds per round of each implementation (default 2)
  --rounds N    interleaved rounds per implementation; medians are reported (default 3)";

/// Uncontended implementations times concurrencies, plus the hot-key implementations.
const MEASUREMENTS: usize = 5 * 2 + 3;
/// `macro`: two implementations times two concurrencies.
const MACRO_MEASUREMENTS: usize = 2 * 2;

struct Args {
    bench: String,
    seconds: f64,
    rounds: usize,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        bench: "lock".to_string(),
        seconds: 2.0,
        rounds: 3,
    };
    let mut bench = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value (see --help)"))
        };
        match arg.as_str() {
            "--seconds" => {
                let v = value("--seconds")?;
                args.seconds = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| format!("--seconds: expected a positive number, got {v:?}"))?;
            }
            "--rounds" => {
                let v = value("--rounds")?;
                args.rounds =
                    v.parse().ok().filter(|r| *r >= 1).ok_or_else(|| {
                        format!("--rounds: expected a whole number >= 1, got {v:?}")
                    })?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            a if a.starts_with('-') => {
                return Err(format!("unknown option {a:?} (see --help)").into());
            }
            a if bench.is_none() => bench = Some(a.to_string()),
            a => return Err(format!("unexpected argument {a:?} (see --help)").into()),
        }
    }
    if let Some(b) = bench {
        args.bench = b;
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = parse_args()?;
    if ![
        "lock",
        "macro",
        "ratelimit",
        "ids",
        "idempotency",
        "redlock",
    ]
    .contains(&args.bench.as_str())
    {
        return Err(format!(
            "unknown benchmark {:?}; available: lock, macro, ratelimit, ids, idempotency, \
             redlock",
            args.bench
        )
        .into());
    }
    let timing = Timing::new(Duration::from_secs_f64(args.seconds));
    if args.bench == "redlock" {
        println!(
            "bench redlock: {} rounds of {} s per measurement, medians reported (about {:.0} s in all)",
            args.rounds,
            args.seconds,
            timing
                .estimate(redlock::MEASUREMENTS, args.rounds)
                .as_secs_f64()
        );
        return redlock::run(timing, args.rounds).await;
    }
    let server = RedisServer::start();
    let url = server.url();
    let measurements = match args.bench.as_str() {
        "macro" => MACRO_MEASUREMENTS,
        "ratelimit" => 2,
        "ids" => ids::MEASUREMENTS,
        "idempotency" => idempotency::MEASUREMENTS,
        _ => MEASUREMENTS,
    };
    println!(
        "bench {}: redis-server at {url}, {} rounds of {} s per measurement, \
         medians reported (about {:.0} s in all)",
        args.bench,
        args.rounds,
        args.seconds,
        timing.estimate(measurements, args.rounds).as_secs_f64()
    );
    if args.bench == "macro" {
        return macro_bench::run(&url, timing, args.rounds).await;
    }
    if args.bench == "ratelimit" {
        return ratelimit::run(&url, timing, args.rounds).await;
    }
    if args.bench == "ids" {
        return ids::run(&url, timing, args.rounds).await;
    }
    if args.bench == "idempotency" {
        return idempotency::run(&url, timing, args.rounds).await;
    }
    uncontended::run(&url, timing, args.rounds).await?;
    hot::run(&url, timing, args.rounds).await?;
    Ok(())
}
