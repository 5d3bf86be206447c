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
//!   - `rslock`: the `rslock` crate's `lock`/`unlock` on the same server;
//!   - `ours_unbatched`: `ours` on a client with batching off.
//!
//!   Figures: `<impl>_cycles_per_s` (lock + unlock cycles per second, all tasks
//!   together), `<impl>_cpu_us_per_cycle redis A client B` (CPU microseconds per cycle
//!   spent by redis-server and by this process), `<impl>_cycles_per_s_rounds` (each
//!   round's rate, whose ratios to the baseline's judge the run; see
//!   [Ratios and disturbed runs](#ratios-and-disturbed-runs)).
//! * **Hot key** (`hot_key <impl> ...`): 64 tasks on one key, so every release hands
//!   the lock over to a waiter; `ours_1_clients` and `ours_4_clients` share the tasks
//!   over 1 or 4 `LockClient`s, `ours_fair_4_clients` is a fair lock
//!   (`LockOptions::fair`) on 4 clients, `rslock` retries on its own. Figures: `handoffs_per_s`
//!   (and `handoffs_per_s_rounds`, each round's rate);
//!   `handoff_p50_us`/`handoff_p99_us`, the time from a holder's release to the next
//!   grant; `handoffs_to_other_task_pct`, of the grants that follow a release, the
//!   percentage that went to a different task than the one that just released (low =
//!   the releaser tends to win the lock straight back); and `longest_wait_ms`, the
//!   longest any single acquisition waited in the round, from calling lock to the
//!   grant, `wait_p99_ms` the 99th percentile of those waits, and
//!   `in_arrival_order_pct`, the grants that overtook no waiter which had called lock
//!   more than 1 ms before (see [`hot`]). The last four join the figures as
//!   `hot_<impl>_<figure>`, without a baseline. A hold whose release finds it lost
//!   (its lease ran out: on a starved machine an etcd session may not prove its lease
//!   in time) still counts as a grant and is printed as `lost_holds`; the run goes on.
//!
//! # Rounds and medians
//!
//! redis-server and this program share the machine's cores, so one measurement is
//! noisy. Every implementation is therefore measured in `--rounds` interleaved rounds
//! (round 1 in the order above, each later round rotated by one, so no implementation
//! always runs first or right after the same one), each for `--seconds`. The printed
//! rates are the medians over the rounds (the CPU figures too, each separately; on the
//! hot key also the handoff percentage and the per-round longest wait); the first round
//! is preceded by a short warm-up, later rounds by a shorter one.
//!
//! # Ratios and disturbed runs
//!
//! A figure compares ours with a baseline measured in the same rounds, so every round
//! gives one ratio of the two, taken seconds apart: a host that steals CPU slows both
//! sides of a round alike, while it can move one side's rates 2.5x between rounds.
//! A figure is therefore judged on its per-round ratios, never on absolute rates:
//! `ratio <name> <r> spread <s> rounds <r1 r2 ..>`, where `r` is the median of the
//! per-round ratios (above 1 = ours better: ours over the baseline for rates, the
//! baseline over ours for latencies) and `s` their spread, `(max - min) / median` over
//! the middle rounds: all but the highest and lowest quarter ([`measure::trimmed`]:
//! none of 3 or 4 rounds, one at each end of 5 to 8, two of 9 to 12), since one round
//! beside a neighbour's burst says nothing of the others.
//!
//! A figure whose spread exceeds [`measure::MAX_ROUND_SPREAD`], 0.15, is disturbed: a
//! `disturbed <name> ratio spread <x.xx> (bound 0.15)` line follows its ratio line and
//! its ratio reads `DISTURBED`. Its rounds still answer a target they all fall on one
//! side of: `>= t (met in every round)` or `>= t (missed in every round)`; a target
//! with rounds on both sides is `not judged: disturbed`, and such a figure (or a
//! disturbed one without a target) is undecided. Every run ends with `figures: N,
//! disturbed: K, undecided: U ...` and, if U > 0, says why the run is not a result and
//! exits with status 1; `all` still prints its table, then the disturbed figures'
//! names.
//! However much the absolute rates drift, a run whose ratios agree, or agree on each
//! verdict, is a result.
//!
//! Figures without a baseline (the hot key's `handoffs_to_other_task_pct` and
//! `longest_wait_ms`) are informational: shown as medians, never judged, never
//! disturbed. The per-round rates of every implementation are printed for the reader
//! and judge nothing.
//!
//! * **Leader failover** (`scripts/bench failover`, [`failover`]): per store, the time
//!   from a leader's resignation to the next leader's start, p50 and p99, without a
//!   baseline.
//! * **etcd and ZooKeeper** ([`consensus`], on a 3-member etcd cluster and a ZooKeeper
//!   started for the run): uncontended cycles at 1 and 16 tasks and handoffs on one
//!   hot name between 8 clients, lock-core on etcd (`etcd_ours`) against the raw etcd
//!   client issuing the Go `concurrency.Mutex` calls by hand (`etcd_raw`) and beside
//!   lock-core on ZooKeeper (`zookeeper_ours`).
//!
//! Ratios printed (the figures of the table, and a few printed only):
//! * `ours_vs_floor_{N}_tasks`: what lock-core delivers compared to the bare recipe;
//! * `our_scripts_raw_vs_floor_{N}_tasks`: the cost of our scripts' semantics alone;
//! * `ours_vs_our_scripts_raw_{N}_tasks`: the library's own overhead (1.0 = none);
//! * `ours_watchdog_vs_floor_{N}_tasks`: as `ours_vs_floor`, with the watchdog lease;
//! * `ours_vs_rslock_{N}_tasks`: against the peer crate;
//! * `ours_unbatched_vs_floor_{N}_tasks`, `ours_vs_ours_unbatched_{N}_tasks`: batching;
//! * `lone_cycle_p50_ours_vs_unbatched`: one task's cycle, every one timed: the p50
//!   with batching off over ours (a lone call keeps its latency: at least 0.95);
//! * `ours_read_hold_vs_ours_{N}_tasks`: a read hold's cycle (read-write lock) against
//!   a plain lock's;
//! * `ours_vs_floor_64_tasks_one_thread`: `ours_vs_floor` at 64 tasks with each
//!   implementation's client and tasks on a one-thread runtime of its own (lines
//!   `<impl>_one_thread_...`), where one thread writes the calls and handles the
//!   replies;
//! * `hot_handoffs_ours_{1_client,4_clients}_vs_rslock`: handoffs per second on the
//!   hot key against rslock;
//! * `hot_handoff_p50_ours_1_client_vs_rslock`: rslock's median handoff time over ours
//!   (above 1 = ours hands over faster);
//! * `hot_handoffs_fair_vs_plain_4_clients`, `hot_wait_p99_fair_vs_plain_4_clients`:
//!   what a fair lock's line costs in handoffs per second and gives in p99 wait (the
//!   plain lock's over the fair one's) against the plain lock on the same 4 clients;
//! * `etcd_ours_vs_raw_{1,16}_tasks`, `etcd_ours_vs_zookeeper_ours_{1,16}_tasks`:
//!   uncontended cycles on etcd against the raw client, and against ours on ZooKeeper;
//! * `hot_etcd_handoffs_ours_vs_raw`, `hot_etcd_handoff_{p50,p99}_ours_vs_raw` and
//!   `hot_etcd_handoff_{p50,p99}_ours_vs_zookeeper_ours`: the hot name on etcd.
//!
//! Options: `--seconds N` per measurement (default 2), `--rounds N` (default 5).
//!
//! # Instructions per operation
//!
//! `scripts/bench instructions [<bench>..]` counts, with callgrind, the instructions one
//! operation costs each side of a figure ([`instructions::PAIRS`]): the lock's
//! uncontended cycle (ours with a fixed lease and with the watchdog lease, unbatched,
//! the floor, rslock) at 1 and 64 tasks (64 on distinct names), `#[cache_lock]` and by
//! hand, GCRA and its script baselines, segment and per-id ids, idempotent POSTs and by
//! hand, and the flash sale's order requests, ours and the floor
//! ([`sale_instructions`]: one `seckill-server` instance is the client side). Each
//! other implementation runs exactly N operations (`--ops`, default
//! [`cli::DEFAULT_OPS`]), then 2N, in the hidden `lock-bench ops` subcommand ([`ops`],
//! on a one-thread runtime, so idle workers searching for work add nothing), on a
//! fresh redis-server each time; the difference of the two counts over N is one
//! operation, start-up cancelling out. The client side counts this program under
//! callgrind (for idempotency the whole process: HTTP client, server and layer), the
//! redis side a redis-server under callgrind ended by `SHUTDOWN NOSAVE`
//! ([`callgrind`]). A count does not move with the host's load the way a rate does:
//! most repeat within 1-2% run to run. What depends on timing still shows: rslock at
//! 64 tasks (its tasks take turns on one async mutex) moved by up to 15%, and how many
//! calls queue behind one in flight (how large lock-core's batches get at 64 tasks)
//! depends on the two sides' relative speed, which valgrind changes by slowing the
//! counted side. Lines: `instructions <impl> tasks=T client X (N ops: a, 2N ops: b)
//! redis Y (...)`, then per figure `instructions <bench> <figure>: <ours> client ..
//! redis .. | <baseline> client .. redis .. | ours/baseline client .. redis ..`. No
//! counts: the hot key (a handoff's cost depends on how long waiters wait) and Redlock
//! (five servers).
//!
//! # Every benchmark at once
//!
//! `scripts/bench all` counts the instructions first (`--no-instructions` skips them),
//! then runs every benchmark of [`BENCHES`] in turn (each on its own redis-server, with
//! the same `--seconds` and `--rounds`), prints each one's lines as it goes, and ends
//! with one markdown table ([`report::table`]): bench, figure, ours, baseline (medians),
//! ratio (median of the per-round ratios), spread, instructions per operation on the
//! client and on redis (ours / baseline, and their ratio), and target (`>= t (met)`,
//! `>= t (missed)`, for a disturbed figure `>= t (met in every round)`, `>= t (missed
//! in every round)` or `>= t (not judged: disturbed)`; a missed target stays in the
//! table), then the disturbed-figures summary. A benchmark joins the table by one line
//! in [`BENCHES`].

// A binary: its modules' `pub` items are the program's own, crate-wide by nature.
#![allow(unreachable_pub)]

mod callgrind;
mod cli;
mod consensus;
mod failover;
mod figure;
mod hot;
mod idempotency;
mod ids;
mod instructions;
mod macro_bench;
mod measure;
mod ops;
mod ratelimit;
mod redlock;
mod report;
mod sale_instructions;
mod seckill;
mod uncontended;

use std::time::Duration;

use lock_tests::RedisServer;

use crate::cli::{Args, Command};
use crate::figure::Figure;
use crate::measure::{BoxError, BoxFut, Timing};

/// One benchmark: its name on the command line, what it compares, how many
/// implementations it measures per round (for the time estimate), and its entry point
/// (`run(redis_url, timing, rounds)`, returning the figures for the `all` table).
struct Bench {
    name: &'static str,
    about: &'static str,
    measurements: usize,
    run: fn(String, Timing, usize) -> BoxFut<Vec<Figure>>,
}

/// Every benchmark, in the order `all` runs them.
const BENCHES: &[Bench] = &[
    Bench {
        name: "lock",
        about: "lock-core against the floor and rslock, and on etcd against the raw etcd \
                client and beside ZooKeeper (the default)",
        measurements: MEASUREMENTS,
        run: |url, t, r| {
            Box::pin(async move {
                let mut figures = uncontended::run(&url, t, r).await?;
                figures.extend(hot::run(&url, t, r).await?);
                figures.extend(consensus::run(t, r).await?);
                Ok(figures)
            })
        },
    },
    Bench {
        name: "macro",
        about: "an #[cache_lock] fn against the same work by hand",
        measurements: MACRO_MEASUREMENTS,
        run: |url, t, r| Box::pin(async move { macro_bench::run(&url, t, r).await }),
    },
    Bench {
        name: "ratelimit",
        about: "GCRA decisions against a trivial one-key script",
        measurements: ratelimit::OPS.len(),
        run: |url, t, r| Box::pin(async move { ratelimit::run(&url, t, r).await }),
    },
    Bench {
        name: "ids",
        about: "order ids per second: one script call per id against segment mode",
        measurements: ids::MEASUREMENTS,
        run: |url, t, r| Box::pin(async move { ids::run(&url, t, r).await }),
    },
    Bench {
        name: "idempotency",
        about: "POSTs/s behind IdempotencyLayer against the same Redis round trips by hand",
        measurements: idempotency::MEASUREMENTS,
        run: |url, t, r| Box::pin(async move { idempotency::run(&url, t, r).await }),
    },
    Bench {
        name: "redlock",
        about: "a Redlock over 5 local masters against single-node locking and rslock over \
                the same masters (latency p50/p99, throughput)",
        measurements: redlock::MEASUREMENTS,
        run: |url, t, r| Box::pin(async move { redlock::run(&url, t, r).await }),
    },
    Bench {
        name: "failover",
        about: "leader election: time from a leader's resignation to the next leader, per \
                store (memory, Redis, PostgreSQL, MySQL, ZooKeeper, etcd)",
        measurements: failover::STORES.len(),
        run: |url, t, r| Box::pin(async move { failover::run(&url, t, r).await }),
    },
    Bench {
        name: "seckill",
        about: "the demo's flash sale (2 instances, 2000 buyers): requests/s, p99",
        measurements: seckill::NAMES.len(),
        run: |url, t, r| Box::pin(async move { seckill::run(&url, t, r).await }),
    },
];

/// Uncontended implementations times concurrencies, the lone cycle's latency with
/// batching on and off, the hot-key implementations, and the consensus stores'.
const MEASUREMENTS: usize = 7 * 2 + 2 + 4 + consensus::MEASUREMENTS;
/// `macro`: two implementations times two concurrencies.
const MACRO_MEASUREMENTS: usize = 2 * 2;

fn usage() -> String {
    let mut names: Vec<&str> = BENCHES.iter().map(|b| b.name).collect();
    names.push("all");
    let mut out = format!(
        "usage: lock-bench [{}] [--seconds N] [--rounds N]\n       \
         lock-bench instructions [<bench>..] [--ops N]\n",
        names.join("|")
    );
    for b in BENCHES {
        out.push_str(&format!("  {:<13} {}\n", b.name, b.about));
    }
    out.push_str(&format!(
        "  all           instruction counts, every benchmark above, then one markdown table
  instructions  instructions per operation (callgrind) of the named benchmarks' figures
  --seconds N   measured seconds per round of each implementation (default 2)
  --rounds N    interleaved rounds per implementation; judged on per-round ratios (default 5)
  --ops N       operations of the shorter callgrind run, the longer runs 2N (default {})
  --no-instructions  all without the instruction counts",
        cli::DEFAULT_OPS
    ));
    out
}

/// Runs `bench` on a redis-server of its own and returns its figures.
async fn run_one(bench: &Bench, args: &Args, timing: Timing) -> Result<Vec<Figure>, BoxError> {
    let server = RedisServer::start();
    let url = server.url();
    println!(
        "bench {}: redis-server at {url}, {} rounds of {} s per measurement, \
         judged on per-round ratios (about {:.0} s in all)",
        bench.name,
        args.rounds,
        args.seconds,
        timing
            .estimate(bench.measurements, args.rounds)
            .as_secs_f64()
    );
    (bench.run)(url, timing, args.rounds).await
}

/// Prints how many of `figures` are disturbed and undecided; if any is undecided, says
/// on stderr why the run is not a result and exits with status 1.
fn finish<'a>(figures: impl IntoIterator<Item = &'a Figure>) {
    let figures: Vec<&Figure> = figures.into_iter().collect();
    let disturbed = report::disturbed_count(figures.iter().copied());
    let undecided = report::undecided_count(figures.iter().copied());
    println!("{}", report::summary(figures.len(), disturbed, undecided));
    if undecided > 0 {
        eprintln!("{}", report::not_a_result());
        std::process::exit(1);
    }
}

/// The instruction counts of `benches` (all when empty), with one line per figure.
async fn count_instructions(
    benches: &[String],
    ops: u64,
) -> Result<(Vec<instructions::Pair>, instructions::Counts), BoxError> {
    let known: Vec<&str> = instructions::PAIRS.iter().map(|p| p.bench).collect();
    if let Some(b) = benches.iter().find(|b| !known.contains(&b.as_str())) {
        let mut known = known;
        known.dedup();
        return Err(format!(
            "instructions: no counts for {b:?}; counted: {}",
            known.join(", ")
        )
        .into());
    }
    let (pairs, impls) = instructions::select(benches);
    let counts = instructions::measure(&impls, ops).await?;
    for p in &pairs {
        println!("{}", instructions::pair_line(p, &counts));
    }
    println!();
    Ok((pairs, counts))
}

async fn all(args: &Args, timing: Timing) -> Result<(), BoxError> {
    // Counted first: a missing valgrind fails the run before the rates take minutes.
    let counted = match args.no_instructions {
        true => None,
        false => Some(count_instructions(&[], args.ops).await?),
    };
    let mut rows = Vec::new();
    for bench in BENCHES {
        let figures = run_one(bench, args, timing).await?;
        rows.extend(figures.into_iter().map(|f| (bench.name, f)));
        println!();
    }
    if let Some((pairs, counts)) = &counted {
        for p in instructions::attach(&mut rows, pairs, counts) {
            eprintln!(
                "instructions: no figure {} in bench {} for its counts",
                p.figure, p.bench
            );
        }
    }
    // Disturbed rows stay in the table, marked, judged only where every round agrees;
    // the exit status says whether the whole run is a result.
    println!("{}", report::table(&rows));
    for (bench, f) in rows.iter().filter(|(_, f)| f.disturbed().is_some()) {
        println!(
            "disturbed figure: {bench} {} (ratio spread {})",
            f.name,
            f.spread_text()
        );
    }
    finish(rows.iter().map(|(_, f)| f));
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let Some(args) = cli::parse(std::env::args().skip(1))? else {
        println!("{}", usage());
        return Ok(());
    };
    if let Command::Ops { imp, redis } = &args.command {
        // One thread: a count then holds the implementation's work, not how long the
        // multi-thread scheduler's idle workers searched for some.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        return runtime.block_on(ops::run(imp, args.tasks, args.ops, redis));
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<(), BoxError> {
    let timing = Timing::new(Duration::from_secs_f64(args.seconds));
    match &args.command {
        Command::All => all(&args, timing).await,
        Command::Instructions(benches) => count_instructions(benches, args.ops).await.map(|_| ()),
        Command::Ops { .. } => Err("ops runs on a runtime of its own (see main)".into()),
        Command::Bench(name) => {
            let Some(bench) = BENCHES.iter().find(|b| b.name == name) else {
                let names: Vec<&str> = BENCHES.iter().map(|b| b.name).collect();
                return Err(format!(
                    "unknown benchmark {name:?}; available: {}, all, instructions",
                    names.join(", ")
                )
                .into());
            };
            let figures = run_one(bench, &args, timing).await?;
            finish(&figures);
            Ok(())
        }
    }
}
