//! `lock-bench ops <bench>.<impl> --tasks T --ops N --redis URL` (not in `--help`): runs
//! exactly N operations of one implementation, shared over T tasks, and exits; what
//! [`crate::instructions`] runs under callgrind. A count, not a time, so that two runs
//! differ by exactly their operations. `redlock.<impl>` takes its masters' URLs
//! comma-separated (`--redis URL1,URL2,...`), for counting by hand under callgrind:
//! the instruction table has no Redlock row (five servers).

use crate::measure::{BoxError, Cycle};
use crate::{idempotency, ids, macro_bench, ratelimit, redlock, uncontended};

/// Every name `ops` takes, `<bench>.<impl>`.
pub fn names() -> Vec<String> {
    let mut all = Vec::new();
    let mut add = |bench: &str, names: &mut dyn Iterator<Item = &str>| {
        all.extend(names.map(|n| format!("{bench}.{n}")));
    };
    add("lock", &mut uncontended::op_names());
    add("macro", &mut macro_bench::OPS.into_iter());
    add("ratelimit", &mut ratelimit::OPS.into_iter());
    add("ids", &mut ids::OPS.into_iter());
    add("idempotency", &mut idempotency::OPS.into_iter());
    add("redlock", &mut redlock::NAMES.into_iter());
    all
}

/// The cycle of implementation `name` (`<bench>.<impl>`) on `url`.
async fn cycle_for(name: &str, url: &str) -> Result<Cycle, BoxError> {
    let found = match name.split_once('.') {
        Some(("lock", imp)) => uncontended::op(url, imp).await?,
        Some(("macro", imp)) => macro_bench::op(url, imp).await?,
        Some(("ratelimit", imp)) => ratelimit::op(url, imp).await?,
        Some(("ids", imp)) => ids::op(url, imp).await?,
        Some(("idempotency", imp)) => idempotency::op(url, imp).await?,
        Some(("redlock", imp)) => redlock::op(url, imp).await?,
        _ => None,
    };
    found.ok_or_else(|| {
        format!(
            "ops: unknown implementation {name:?}; available: {}",
            names().join(", ")
        )
        .into()
    })
}

/// How many of `ops` operations each of `tasks` tasks runs: as even as can be, the
/// first ones one more.
pub fn shares(ops: u64, tasks: usize) -> Vec<u64> {
    let t = tasks as u64;
    (0..t).map(|i| ops / t + u64::from(i < ops % t)).collect()
}

/// Runs `ops` operations of implementation `name` on `url`, over `tasks` tasks.
pub async fn run(name: &str, tasks: usize, ops: u64, url: &str) -> Result<(), BoxError> {
    let cycle = cycle_for(name, url).await?;
    let handles: Vec<_> = shares(ops, tasks)
        .into_iter()
        .enumerate()
        .map(|(t, share)| {
            let cycle = cycle.clone();
            tokio::spawn(async move {
                for n in 0..share {
                    cycle(t, n).await?;
                }
                Ok::<(), BoxError>(())
            })
        })
        .collect();
    for h in handles {
        h.await??;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        assert_eq!(shares(10, 3), [4, 3, 3]);
        assert_eq!(shares(2000, 64).iter().sum::<u64>(), 2000);
        assert_eq!(shares(2, 4), [1, 1, 0, 0]);
        assert_eq!(shares(6, 1), [6]);
    }

    #[test]
    fn every_bench_names_its_implementations() {
        let names = names();
        for n in [
            "lock.ours",
            "lock.floor",
            "macro.annotated",
            "ids.segment",
            "redlock.rslock",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} in {names:?}");
        }
    }
}
