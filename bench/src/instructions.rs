//! Instructions per operation, counted by callgrind: `scripts/bench instructions`, and
//! the instruction columns of `all`'s table.
//!
//! Each implementation runs exactly N operations, then 2N, in `lock-bench ops` (see
//! [`crate::ops`]), each run on a fresh redis-server; the difference of the two counts
//! over N is the cost of one operation, start-up and shutdown cancelling out. The
//! client side: `ops` under callgrind, its redis-server native. The redis side: a
//! redis-server under callgrind (see [`crate::callgrind`]), `ops` native. A count does
//! not depend on what else the machine runs, so it holds where rates drift.

use std::collections::HashMap;

use lock_tests::RedisServer;

use crate::callgrind::{Scratch, check_valgrind, count_client, count_server};
use crate::figure::{Figure, PerOp};
use crate::measure::BoxError;
use crate::report::number;
use crate::sale_instructions;

/// One implementation as `lock-bench ops` runs it: `<bench>.<impl>` at `tasks` tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Op {
    pub imp: &'static str,
    pub tasks: usize,
}

/// A figure of `bench` whose two sides get instruction counts.
#[derive(Clone, Copy, Debug)]
pub struct Pair {
    pub bench: &'static str,
    pub figure: &'static str,
    pub ours: Op,
    pub baseline: Op,
}

const fn pair(
    bench: &'static str,
    figure: &'static str,
    ours: &'static str,
    baseline: &'static str,
    tasks: usize,
) -> Pair {
    Pair {
        bench,
        figure,
        ours: Op { imp: ours, tasks },
        baseline: Op {
            imp: baseline,
            tasks,
        },
    }
}

/// Every figure with instruction counts. Not counted: the hot key (its cost per
/// handoff depends on how long waiters wait) and Redlock (five servers). The flash
/// sale's are per order request, the service instance as the client
/// ([`crate::sale_instructions`]).
#[rustfmt::skip]
pub const PAIRS: &[Pair] = &[
    // bench, figure, ours, baseline (as `lock-bench ops` names them), tasks
    pair("lock", "ours_vs_floor_1_tasks",
         "lock.ours", "lock.floor", 1),
    pair("lock", "ours_watchdog_vs_floor_1_tasks",
         "lock.ours_watchdog", "lock.floor", 1),
    pair("lock", "ours_vs_rslock_1_tasks",
         "lock.ours", "lock.rslock", 1),
    pair("lock", "ours_unbatched_vs_floor_1_tasks",
         "lock.ours_unbatched", "lock.floor", 1),
    pair("lock", "ours_read_hold_vs_ours_1_tasks",
         "lock.ours_read", "lock.ours", 1),
    pair("lock", "ours_vs_floor_64_tasks",
         "lock.ours", "lock.floor", 64),
    pair("lock", "ours_watchdog_vs_floor_64_tasks",
         "lock.ours_watchdog", "lock.floor", 64),
    pair("lock", "ours_vs_rslock_64_tasks",
         "lock.ours", "lock.rslock", 64),
    pair("lock", "ours_unbatched_vs_floor_64_tasks",
         "lock.ours_unbatched", "lock.floor", 64),
    pair("macro", "macro_vs_by_hand_1_tasks",
         "macro.annotated", "macro.by_hand", 1),
    pair("macro", "macro_vs_by_hand_64_tasks",
         "macro.annotated", "macro.by_hand", 64),
    pair("ratelimit", "ratelimit_ours_vs_floor_64_tasks",
         "ratelimit.ours", "ratelimit.floor", 64),
    pair("ratelimit", "ratelimit_ours_vs_redis_rate_64_tasks",
         "ratelimit.ours", "ratelimit.redis_rate", 64),
    pair("ratelimit", "ratelimit_ours_unbatched_vs_redis_rate_64_tasks",
         "ratelimit.ours_unbatched", "ratelimit.redis_rate", 64),
    pair("ids", "segment_vs_per_id",
         "ids.segment", "ids.per_id", 64),
    pair("idempotency", "idempotency_fresh_ours_vs_by_hand",
         "idempotency.fresh_ours", "idempotency.fresh_by_hand", 32),
    pair("idempotency", "idempotency_replay_ours_vs_by_hand",
         "idempotency.replay_ours", "idempotency.replay_by_hand", 32),
    pair("seckill", crate::seckill::VS_FLOOR,
         sale_instructions::OURS, sale_instructions::FLOOR, sale_instructions::CONFIG.buyers),
];

/// Counted instructions per operation of every implementation measured.
pub type Counts = HashMap<Op, PerOp>;

/// One operation's instructions from a run of `ops` operations counting `short` and
/// one of `2 * ops` counting `long`; `None` when the longer run counted no more (the
/// operation's cost is below what the run's own variation hides).
pub fn per_op(ops: u64, short: u64, long: u64) -> Option<f64> {
    (long > short && ops > 0).then(|| (long - short) as f64 / ops as f64)
}

/// The pairs of the benchmarks named in `benches` (all of them when empty), and the
/// distinct implementations behind them in order of first use.
pub fn select(benches: &[String]) -> (Vec<Pair>, Vec<Op>) {
    let pairs: Vec<Pair> = PAIRS
        .iter()
        .filter(|p| benches.is_empty() || benches.iter().any(|b| b == p.bench))
        .copied()
        .collect();
    let mut ops: Vec<Op> = Vec::new();
    for op in pairs.iter().flat_map(|p| [p.ours, p.baseline]) {
        if !ops.contains(&op) {
            ops.push(op);
        }
    }
    (pairs, ops)
}

/// `lock-bench ops` arguments for `op` and `n` operations (`--redis` comes last).
fn ops_args(op: Op, n: u64) -> Vec<String> {
    let (tasks, n) = (op.tasks.to_string(), n.to_string());
    ["ops", op.imp, "--tasks", &tasks, "--ops", &n]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// `x.xk (N ops: a, 2N ops: b)`, or why there is no figure.
fn side_text(per: Option<f64>, n: u64, (short, long): (u64, u64)) -> String {
    let counts = format!("{n} ops: {short}, {} ops: {long}", 2 * n);
    match per {
        Some(p) => format!("{} ({counts})", number(p)),
        None => format!("not measured, the longer run counted no more ({counts})"),
    }
}

/// Counts every implementation of `ops` on both sides with runs of `n` and `2n`
/// operations; prints one line per implementation.
pub async fn measure(ops: &[Op], n: u64) -> Result<Counts, BoxError> {
    check_valgrind().await?;
    let scratch = Scratch::new()?;
    let exe = std::env::current_exe()?;
    println!(
        "instructions: {} implementations, each run for {n} and {} operations (the flash \
         sale: {} and {} sales) under callgrind, client side then redis side, a fresh \
         redis-server per run",
        ops.len(),
        2 * n,
        sale_instructions::SALES,
        2 * sale_instructions::SALES,
    );
    let mut counts = Counts::new();
    // The flash sale's two sides, ours then the floor, for their instruction ratio.
    let mut sales = [None, None];
    for &op in ops {
        let per = match op.imp {
            sale_instructions::OURS | sale_instructions::FLOOR => {
                let floor = op.imp == sale_instructions::FLOOR;
                let sale = sale_instructions::measure(&scratch, floor).await?;
                sales[usize::from(floor)] = Some(sale);
                sale.per
            }
            _ => count_op(&scratch, &exe, op, n).await?,
        };
        counts.insert(op, per);
    }
    if let [Some(ours), Some(floor)] = sales {
        let ratio = sale_instructions::instruction_ratio(&ours, &floor)
            .map_or_else(|| "not measured".to_string(), |c| format!("{c:.2}"));
        println!(
            "instructions seckill floor over ours, load generator + service + redis per \
             order request: {ratio}"
        );
    }
    Ok(counts)
}

/// One `lock-bench ops` implementation, both sides; prints one line.
async fn count_op(
    scratch: &Scratch,
    exe: &std::path::Path,
    op: Op,
    n: u64,
) -> Result<PerOp, BoxError> {
    let mut client = [0u64; 2];
    let mut server = [0u64; 2];
    for (i, len) in [n, 2 * n].into_iter().enumerate() {
        let tag = format!("{}-{}-{len}", op.imp, op.tasks);
        let redis = RedisServer::start();
        let mut args = ops_args(op, len);
        args.extend(["--redis".to_string(), redis.url()]);
        client[i] = count_client(scratch, &format!("{tag}-client"), exe, &args).await?;
        drop(redis);
        let args = ops_args(op, len);
        server[i] = count_server(scratch, &format!("{tag}-redis"), exe, &args).await?;
    }
    let per = PerOp {
        client: per_op(n, client[0], client[1]),
        server: per_op(n, server[0], server[1]),
    };
    println!(
        "instructions {} tasks={} client {} redis {}",
        op.imp,
        op.tasks,
        side_text(per.client, n, (client[0], client[1])),
        side_text(per.server, n, (server[0], server[1])),
    );
    Ok(per)
}

fn cell(v: Option<f64>) -> String {
    v.map_or("-".into(), number)
}

/// `instructions <bench> <figure>: ours client A redis B | <baseline> client C redis D
/// | ours/baseline client A/C redis B/D`.
pub fn pair_line(pair: &Pair, counts: &Counts) -> String {
    let get = |op: &Op| counts.get(op).copied().unwrap_or_default();
    let (ours, base) = (get(&pair.ours), get(&pair.baseline));
    let short = |op: &Op| op.imp.split_once('.').map_or(op.imp, |(_, i)| i);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    format!(
        "instructions {} {}: {} client {} redis {} | {} client {} redis {} | ours/baseline \
         client {} redis {}",
        pair.bench,
        pair.figure,
        short(&pair.ours),
        cell(ours.client),
        cell(ours.server),
        short(&pair.baseline),
        cell(base.client),
        cell(base.server),
        ratio(ours.client, base.client),
        ratio(ours.server, base.server),
    )
}

/// Puts the counts of `pairs` into the figures of `rows` they name; returns the pairs
/// whose figure is missing (a renamed figure), so that a run's rates are not lost to it.
pub fn attach<'p>(
    rows: &mut [(&str, Figure)],
    pairs: &'p [Pair],
    counts: &Counts,
) -> Vec<&'p Pair> {
    let get = |op: &Op| counts.get(op).copied().unwrap_or_default();
    let mut missing = Vec::new();
    for p in pairs {
        match rows
            .iter_mut()
            .find(|(bench, f)| *bench == p.bench && f.name == p.figure)
        {
            Some((_, f)) => f.instructions = Some([get(&p.ours), get(&p.baseline)]),
            None => missing.push(p),
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn difference_over_the_extra_operations() {
        // Start-up 5M, 44.6k per op: 2000 ops, then 4000.
        let (short, long) = (5_000_000 + 2000 * 44_600, 5_000_000 + 4000 * 44_600);
        assert_eq!(per_op(2000, short, long), Some(44_600.0));
        assert_eq!(per_op(2000, 10, 10), None);
        assert_eq!(per_op(2000, 11, 10), None);
        assert_eq!(per_op(0, 1, 2), None);
    }

    #[test]
    fn selection_and_lines() {
        let (pairs, ops) = select(&["macro".to_string()]);
        assert_eq!(pairs.len(), 2);
        assert_eq!(ops.len(), 4, "{ops:?}");
        let (all, ops) = select(&[]);
        assert_eq!(all.len(), PAIRS.len());
        // lock: 5 implementations at 2 concurrencies, shared between its figures, and
        // the read hold at 1 task.
        assert_eq!(
            ops.iter().filter(|o| o.imp.starts_with("lock.")).count(),
            11
        );
        // Every implementation is one `measure` knows how to run.
        let known = crate::ops::names();
        let sale = [sale_instructions::OURS, sale_instructions::FLOOR];
        for op in &ops {
            assert!(
                known.iter().any(|k| k == op.imp) || sale.contains(&op.imp),
                "{} is an ops name or a flash-sale side",
                op.imp
            );
        }
        assert_eq!(
            ops.iter().filter(|o| o.imp.starts_with("seckill.")).count(),
            2
        );
        let p = pair(
            "lock",
            "ours_vs_floor_64_tasks",
            "lock.ours",
            "lock.floor",
            64,
        );
        let mut counts = Counts::new();
        counts.insert(
            p.ours,
            PerOp {
                client: Some(44_600.0),
                server: Some(30_000.0),
            },
        );
        counts.insert(
            p.baseline,
            PerOp {
                client: Some(21_300.0),
                server: None,
            },
        );
        assert_eq!(
            pair_line(&p, &counts),
            "instructions lock ours_vs_floor_64_tasks: ours client 44.6k redis 30.0k | floor \
             client 21.3k redis - | ours/baseline client 2.09 redis -"
        );
        assert_eq!(
            ops_args(p.ours, 2000),
            ["ops", "lock.ours", "--tasks", "64", "--ops", "2000"]
        );
    }

    #[test]
    fn counts_join_their_figures() {
        let p = pair("ids", "segment_vs_per_id", "ids.segment", "ids.per_id", 64);
        let mut counts = Counts::new();
        counts.insert(
            p.ours,
            PerOp {
                client: Some(900.0),
                server: None,
            },
        );
        let f = Figure::rounds("segment_vs_per_id", "ids/s", &[2.0], &[1.0]);
        let mut rows = vec![("ids", f)];
        assert!(attach(&mut rows, &[p], &counts).is_empty());
        let [ours, base] = rows[0].1.instructions.unwrap();
        assert_eq!(ours.client, Some(900.0));
        assert_eq!(base, PerOp::default());
        let missing = pair("ids", "no_such_figure", "ids.segment", "ids.per_id", 64);
        assert_eq!(attach(&mut rows, &[missing], &counts).len(), 1);
    }
}
