//! Measurement helpers shared by the benchmarks: boxed per-implementation cycles, the
//! cycles-per-second + CPU-per-cycle measurement, round ordering, medians, and the
//! spread that judges a figure's per-round ratios (see [`crate::figure`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, HeldLock, Lease, LockOptions};
use redis::aio::ConnectionManager;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed future, so every implementation is driven through the same (dyn) call path.
pub type BoxFut<T> = Pin<Box<dyn Future<Output = Result<T, BoxError>> + Send>>;

/// One lock/unlock cycle of an implementation: `cycle(task, n)` for the `n`-th cycle of
/// task number `task`.
pub type Cycle = Arc<dyn Fn(usize, u64) -> BoxFut<()> + Send + Sync>;

/// Boxes `f` into a [`Cycle`].
pub fn cycle<F, Fut>(f: F) -> Cycle
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    Arc::new(move |t, n| Box::pin(f(t, n)))
}

/// lock-core's acquire (a fixed 10 s lease, no wait) and release of one name per task,
/// `("bench", kind, task)`, on `locks` (a client, a Redlock, any store).
pub fn fixed_lease_cycle<L>(locks: L, kind: &'static str) -> Cycle
where
    L: DistributedLock + Clone + Send + Sync + 'static,
    L::Guard: Send,
{
    let fixed = LockOptions::new()
        .lease(Lease::Fixed(Duration::from_secs(10)))
        .wait(Duration::ZERO);
    acquire_cycle(locks, kind, fixed)
}

/// lock-core's acquire with `options` and release of one name per task,
/// `("bench", kind, task)`, on `locks`.
pub fn acquire_cycle<L>(locks: L, kind: &'static str, options: LockOptions) -> Cycle
where
    L: DistributedLock + Clone + Send + Sync + 'static,
    L::Guard: Send,
{
    cycle(move |t, _| {
        let (locks, options) = (locks.clone(), options.clone());
        async move {
            let g = locks.acquire(("bench", kind, t), options).await?;
            g.release().await?;
            Ok(())
        }
    })
}

/// The `rslock` crate's lock and unlock of one name per task, on `rslock`'s servers
/// (one, or a Redlock's masters).
pub fn rslock_cycle(rslock: rslock::LockManager) -> Cycle {
    cycle(move |t, _| {
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
    })
}

/// How long each measurement runs, and its warm-up.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Measured time of every round of every implementation.
    pub measure: Duration,
    /// Warm-up before an implementation's first round (connections, script cache,
    /// allocator): a fifth of `measure`, at most 250 ms.
    pub first_warm: Duration,
    /// Warm-up before its later rounds (back to steady state after another
    /// implementation ran): a twentieth of `measure`, at most 50 ms.
    pub later_warm: Duration,
}

impl Timing {
    pub fn new(measure: Duration) -> Self {
        Self {
            measure,
            first_warm: (measure / 5).min(Duration::from_millis(250)),
            later_warm: (measure / 20).min(Duration::from_millis(50)),
        }
    }

    /// The warm-up before round `round` (0-based).
    pub fn warm(&self, round: usize) -> Duration {
        if round == 0 {
            self.first_warm
        } else {
            self.later_warm
        }
    }

    /// Rough wall time of `measurements` implementations measured for `rounds` rounds.
    pub fn estimate(&self, measurements: usize, rounds: usize) -> Duration {
        let per_impl = self.first_warm
            + self.later_warm * (rounds as u32).saturating_sub(1)
            + self.measure * rounds as u32;
        per_impl * measurements as u32
    }
}

/// The order of implementations in round `round` (0-based) out of `n`: round 0 is
/// `0, 1, .., n-1`, every later round starts one further along, wrapping around.
pub fn round_order(n: usize, round: usize) -> impl Iterator<Item = usize> {
    (0..n).map(move |i| (i + round) % n)
}

/// The median; the mean of the middle two for an even count, NaN for none.
pub fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The `q` quantile of `sorted` (ascending): the value at the nearest rank, NaN for
/// none.
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// `values` rounded and space-separated, for the per-round lines.
pub fn rounds_list(values: impl IntoIterator<Item = f64>) -> String {
    values
        .into_iter()
        .map(|v| format!("{v:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The most a figure's per-round ratios may disagree, as a [`spread`], before the
/// figure counts as disturbed (the two sides did not see the same machine within a
/// round) and stops being a result.
pub const MAX_ROUND_SPREAD: f64 = 0.15;

/// How many rounds [`spread`] sets aside at each end out of `n`: a quarter, rounded
/// down, of all but one (none of 3 or 4, one of 5 to 8, two of 9 to 12).
pub fn trimmed(n: usize) -> usize {
    n.saturating_sub(1) / 4
}

/// How far per-round values disagree: `(max - min) / median` over the middle rounds,
/// the [`trimmed`] fastest and slowest set aside (one round that a neighbour on the
/// host slowed down, or sped up, says nothing of the others; the median is robust to
/// it already). 0 for fewer than two values or when the middle ones are equal;
/// infinite when a value is not finite or the median is not positive while the values
/// differ (no meaningful relative spread).
pub fn spread(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().collect();
    if v.len() < 2 {
        return 0.0;
    }
    if v.iter().any(|x| !x.is_finite()) {
        return f64::INFINITY;
    }
    v.sort_by(f64::total_cmp);
    let cut = trimmed(v.len());
    let (min, max) = (v[cut], v[v.len() - 1 - cut]);
    if max == min {
        return 0.0;
    }
    let mid = median(v);
    if mid > 0.0 {
        (max - min) / mid
    } else {
        f64::INFINITY
    }
}

/// Whether a [`spread`] exceeds [`MAX_ROUND_SPREAD`].
pub fn exceeds_bound(spread: f64) -> bool {
    spread > MAX_ROUND_SPREAD
}

/// A server whose CPU time a measurement reads before and after, to give each
/// implementation's server-side CPU per cycle.
pub trait ServerCpu {
    /// Seconds of CPU the server has used so far (user + system).
    fn seconds(&mut self) -> impl Future<Output = Result<f64, BoxError>> + Send;
}

/// A redis-server, read through INFO CPU.
impl ServerCpu for ConnectionManager {
    async fn seconds(&mut self) -> Result<f64, BoxError> {
        let info: String = redis::cmd("INFO").arg("CPU").query_async(self).await?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| {
                    l.strip_prefix(name)?
                        .strip_prefix(':')?
                        .trim()
                        .parse::<f64>()
                        .ok()
                })
                .unwrap_or(0.0)
        };
        Ok(field("used_cpu_user") + field("used_cpu_sys"))
    }
}

/// Server processes on this machine (an etcd cluster's members, a ZooKeeper), by pid:
/// the sum of their CPU times.
pub struct Processes(pub Vec<u32>);

impl ServerCpu for Processes {
    async fn seconds(&mut self) -> Result<f64, BoxError> {
        Ok(self.0.iter().map(|pid| process_cpu(&pid.to_string())).sum())
    }
}

/// CPU seconds (user + system) of process `pid` (`self` for this one), from
/// `/proc/<pid>/stat`; 0 for a process that cannot be read.
fn process_cpu(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// This process's CPU seconds (user + system).
fn own_cpu() -> f64 {
    process_cpu("self")
}

/// One round of one implementation.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub cycles_per_s: f64,
    /// CPU microseconds per cycle spent by the server (redis-server, etcd, ...).
    pub server_us: f64,
    /// CPU microseconds per cycle spent by this process.
    pub client_us: f64,
}

/// Runs `tasks` copies of `cycle` until `until`; returns the number of cycles done.
async fn run_until(cycle: &Cycle, tasks: usize, until: Instant) -> Result<u64, BoxError> {
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let cycle = cycle.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    cycle(t, n).await?;
                    n += 1;
                }
                Ok::<u64, BoxError>(n)
            })
        })
        .collect();
    let mut total = 0;
    for h in handles {
        total += h.await??;
    }
    Ok(total)
}

/// Runs `tasks` copies of `cycle` for `warm`, then measures them for `measure`: cycles
/// per second and CPU per cycle (the server's read through `server`).
pub async fn rate(
    server: &mut impl ServerCpu,
    cycle: &Cycle,
    tasks: usize,
    warm: Duration,
    measure: Duration,
) -> Result<Sample, BoxError> {
    run_until(cycle, tasks, Instant::now() + warm).await?;
    let (server_before, own_before) = (server.seconds().await?, own_cpu());
    let start = Instant::now();
    let total = run_until(cycle, tasks, start + measure).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let (server_after, own_after) = (server.seconds().await?, own_cpu());
    let per = |cpu: f64| cpu * 1e6 / total.max(1) as f64;
    Ok(Sample {
        cycles_per_s: total as f64 / elapsed,
        server_us: per(server_after - server_before),
        client_us: per(own_after - own_before),
    })
}

/// One task, cycles timed one by one for `warm + measure`; returns (p50, p99) in µs.
async fn latency(cycle: &Cycle, warm: Duration, measure: Duration) -> Result<(f64, f64), BoxError> {
    let until = Instant::now() + warm;
    let mut n = 0;
    while Instant::now() < until {
        cycle(0, n).await?;
        n += 1;
    }
    let mut v = Vec::new();
    let until = Instant::now() + measure;
    while Instant::now() < until {
        let t = Instant::now();
        cycle(0, n).await?;
        n += 1;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    v.sort_by(f64::total_cmp);
    Ok((percentile(&v, 0.5), percentile(&v, 0.99)))
}

/// [`latency`] of every cycle in `cycles`, one task, for `rounds` interleaved rounds
/// (see [`round_order`]); returns each cycle's (p50, p99) per round, in order.
pub async fn latency_rounds(
    cycles: &[&Cycle],
    timing: Timing,
    rounds: usize,
) -> Result<Vec<Vec<(f64, f64)>>, BoxError> {
    let mut lat = vec![Vec::with_capacity(rounds); cycles.len()];
    for round in 0..rounds {
        for i in round_order(cycles.len(), round) {
            lat[i].push(latency(cycles[i], timing.warm(round), timing.measure).await?);
        }
    }
    Ok(lat)
}

/// Measures every cycle in `cycles` for `rounds` interleaved rounds (see
/// [`round_order`]) at `tasks` concurrency; returns each cycle's samples, in order.
pub async fn measure_rounds(
    probe: &mut impl ServerCpu,
    cycles: &[Cycle],
    tasks: usize,
    timing: Timing,
    rounds: usize,
) -> Result<Vec<Vec<Sample>>, BoxError> {
    let mut samples: Vec<Vec<Sample>> = vec![Vec::with_capacity(rounds); cycles.len()];
    for round in 0..rounds {
        for i in round_order(cycles.len(), round) {
            let s = rate(probe, &cycles[i], tasks, timing.warm(round), timing.measure).await?;
            samples[i].push(s);
        }
    }
    Ok(samples)
}

/// One implementation's cycles per second, round by round.
pub fn rates(samples: &[Sample]) -> Vec<f64> {
    samples.iter().map(|s| s.cycles_per_s).collect()
}

/// The median cycles per second of each cycle's samples.
pub fn median_rates(samples: &[Vec<Sample>]) -> Vec<f64> {
    samples
        .iter()
        .map(|s| median(s.iter().map(|s| s.cycles_per_s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median([3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median([4.0, 1.0]), 2.5);
        assert!(median([]).is_nan());
    }

    fn samples(values: &[f64]) -> Vec<Sample> {
        values
            .iter()
            .map(|&cycles_per_s| Sample {
                cycles_per_s,
                server_us: 0.0,
                client_us: 0.0,
            })
            .collect()
    }

    #[test]
    fn spread_is_range_over_median() {
        // (110 - 90) / 100
        let s = spread(rates(&samples(&[100.0, 90.0, 110.0])));
        assert!((s - 0.2).abs() < 1e-12, "{s}");
        assert!(exceeds_bound(s));
        // (1060 - 1000) / 1030 = 0.058: within the bound.
        let s = spread([1000.0, 1060.0, 1030.0]);
        assert!((s - 60.0 / 1030.0).abs() < 1e-12, "{s}");
        assert!(!exceeds_bound(s));
        // Even count: the median is the mean of the middle two, (140 - 60) / 100.
        let s = spread([60.0, 90.0, 110.0, 140.0]);
        assert!((s - 0.8).abs() < 1e-12, "{s}");
    }

    #[test]
    fn spread_sets_aside_the_outer_quarter_from_five_rounds() {
        assert_eq!(
            (3..=13).map(trimmed).collect::<Vec<_>>(),
            [0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
        );
        // Five rounds, one far off: the middle three (95, 100, 104) agree.
        let s = spread([100.0, 60.0, 95.0, 104.0, 150.0]);
        assert!((s - 9.0 / 100.0).abs() < 1e-12, "{s}");
        assert!(!exceeds_bound(s));
        // Two far off on the same side are not set aside: (130 - 95) / 100.
        let s = spread([100.0, 95.0, 130.0, 160.0, 90.0]);
        assert!((s - 0.35).abs() < 1e-12, "{s}");
        assert!(exceeds_bound(s));
        // Three rounds: nothing is set aside.
        let s = spread([100.0, 60.0, 101.0]);
        assert!((s - 0.41).abs() < 1e-12, "{s}");
    }

    #[test]
    fn spread_edge_cases() {
        assert_eq!(spread([]), 0.0);
        assert_eq!(spread([5.0]), 0.0);
        assert_eq!(spread([7.0, 7.0, 7.0]), 0.0);
        assert_eq!(spread([0.0, 0.0]), 0.0);
        // Median 0 with differing rounds, or a round without a number: disturbed.
        assert_eq!(spread([0.0, 0.0, 5.0]), f64::INFINITY);
        assert_eq!(spread([1.0, f64::NAN]), f64::INFINITY);
        assert!(exceeds_bound(f64::INFINITY));
    }

    #[test]
    fn bound_is_fifteen_percent() {
        assert_eq!(MAX_ROUND_SPREAD, 0.15);
        assert!(!exceeds_bound(0.15));
        assert!(exceeds_bound(0.151));
    }

    #[test]
    fn medians_per_implementation() {
        let s = [samples(&[3.0, 1.0, 2.0]), samples(&[10.0, 30.0])];
        assert_eq!(median_rates(&s), [2.0, 20.0]);
        assert_eq!(rates(&s[1]), [10.0, 30.0]);
    }

    #[test]
    fn rounds_rotate() {
        let r: Vec<Vec<usize>> = (0..3).map(|r| round_order(5, r).collect()).collect();
        assert_eq!(r[0], [0, 1, 2, 3, 4]);
        assert_eq!(r[1], [1, 2, 3, 4, 0]);
        assert_eq!(r[2], [2, 3, 4, 0, 1]);
    }
}
