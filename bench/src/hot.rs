//! Hot key: 64 tasks on one key, so every release hands the lock to a waiter. Measures
//! handoffs per second, the time from one holder's release to the next grant, how often
//! the lock goes to a different task than the one that just released it, how long
//! acquisitions waited (p99 and longest), and how many grants went in arrival order:
//! to a waiter with nobody still waiting who had called lock more than
//! [`ARRIVAL_SLACK`] before it (the slack covers a round trip: a line orders waiters by
//! when their first attempt reached the server, not by when they called).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{Lease, LockClient, LockConfig, LockError, LockOptions};

use crate::figure::Figure;
use crate::measure::{BoxError, BoxFut, Timing, median, round_order, rounds_list};

/// Tasks contending for the key.
const TASKS: usize = 64;

/// Indices into `run`'s implementations.
const ONE: usize = 0;
const FOUR: usize = 1;
const FAIR: usize = 2;
const PEER: usize = 3;

/// How much earlier than a granted waiter another must have called lock to count as
/// overtaken.
pub const ARRIVAL_SLACK: Duration = Duration::from_millis(1);

/// The `q` quantile of `sorted` nanoseconds (the lower rank), as f64; 0 for none.
fn ns_at(sorted: &[u64], q: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * q) as usize)
        .map_or(0.0, |&ns| ns as f64)
}

/// [`Handoffs::last_releaser`] when no release is pending.
const NO_TASK: usize = usize::MAX;

/// Handoff statistics on one contended key.
pub struct Handoffs {
    last_release: Mutex<Option<Instant>>,
    latencies_ns: Mutex<Vec<u64>>,
    grants: AtomicU64,
    /// The task that released last, [`NO_TASK`] once the next grant has read it.
    last_releaser: AtomicUsize,
    /// Grants that followed a release (every grant but the round's first).
    after_release: AtomicU64,
    /// Of those, grants to a different task than the one that released.
    to_other_task: AtomicU64,
    /// The longest single acquisition, from calling lock to the grant.
    longest_wait_ns: AtomicU64,
    /// Every acquisition's wait, calling lock to the grant.
    waits_ns: Mutex<Vec<u64>>,
    /// When each acquisition still waiting called lock (how many called then).
    waiting: Mutex<BTreeMap<Instant, usize>>,
    /// Grants with a waiter left behind that had called lock more than
    /// [`ARRIVAL_SLACK`] earlier.
    overtaking: AtomicU64,
    /// Holds whose release found them lost ([`released`](Self::released)).
    lost: AtomicU64,
}

impl Default for Handoffs {
    fn default() -> Self {
        Self {
            last_release: Mutex::default(),
            latencies_ns: Mutex::default(),
            grants: AtomicU64::new(0),
            last_releaser: AtomicUsize::new(NO_TASK),
            after_release: AtomicU64::new(0),
            to_other_task: AtomicU64::new(0),
            longest_wait_ns: AtomicU64::new(0),
            waits_ns: Mutex::default(),
            waiting: Mutex::default(),
            overtaking: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }
    }
}

impl Handoffs {
    /// A task calls lock now: the instant to hand to [`granted`](Self::granted).
    pub fn calling(&self) -> Instant {
        let called = Instant::now();
        *self.waiting.lock().unwrap().entry(called).or_default() += 1;
        called
    }

    /// Task `task`, which called lock at `called` ([`calling`](Self::calling)), now
    /// holds the lock.
    pub fn granted(&self, task: usize, called: Instant) {
        let waited_ns = called.elapsed().as_nanos() as u64;
        self.longest_wait_ns.fetch_max(waited_ns, Ordering::Relaxed);
        self.waits_ns.lock().unwrap().push(waited_ns);
        {
            let mut waiting = self.waiting.lock().unwrap();
            if let Some(n) = waiting.get_mut(&called) {
                *n -= 1;
                if *n == 0 {
                    waiting.remove(&called);
                }
            }
            if waiting
                .keys()
                .next()
                .is_some_and(|first| *first + ARRIVAL_SLACK < called)
            {
                self.overtaking.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.grants.fetch_add(1, Ordering::Relaxed);
        let releaser = self.last_releaser.swap(NO_TASK, Ordering::AcqRel);
        if releaser != NO_TASK {
            self.after_release.fetch_add(1, Ordering::Relaxed);
            if releaser != task {
                self.to_other_task.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some(at) = self.last_release.lock().unwrap().take() {
            let ns = at.elapsed().as_nanos() as u64;
            self.latencies_ns.lock().unwrap().push(ns);
        }
    }

    /// Task `task` is about to release the lock.
    pub fn releasing(&self, task: usize) {
        self.last_releaser.store(task, Ordering::Release);
        *self.last_release.lock().unwrap() = Some(Instant::now());
    }

    /// What a release answered. A hold lost before it (its lease ran out: a store's
    /// session that could not prove its lease on a starved machine, say) still was a
    /// grant, counted and printed (`lost_holds`), and the round goes on; any other
    /// error ends it.
    pub fn released<T>(&self, answer: Result<T, LockError>) -> Result<(), BoxError> {
        match answer {
            Ok(_) => Ok(()),
            Err(e) if e.is_lost() => {
                self.lost.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn sample(&self, elapsed: Duration) -> HotSample {
        let sorted = |ns: &Mutex<Vec<u64>>| {
            let mut v = ns.lock().unwrap().clone();
            v.sort_unstable();
            v
        };
        let (latencies, waits) = (sorted(&self.latencies_ns), sorted(&self.waits_ns));
        let after_release = self.after_release.load(Ordering::Relaxed);
        let grants = self.grants.load(Ordering::Relaxed);
        HotSample {
            handoffs_per_s: grants as f64 / elapsed.as_secs_f64(),
            p50_us: ns_at(&latencies, 0.5) / 1e3,
            p99_us: ns_at(&latencies, 0.99) / 1e3,
            to_other_task_pct: self.to_other_task.load(Ordering::Relaxed) as f64 * 100.0
                / after_release.max(1) as f64,
            longest_wait_ms: self.longest_wait_ns.load(Ordering::Relaxed) as f64 / 1e6,
            wait_p99_ms: ns_at(&waits, 0.99) / 1e6,
            in_arrival_order_pct: 100.0
                - self.overtaking.load(Ordering::Relaxed) as f64 * 100.0 / grants.max(1) as f64,
            lost_holds: self.lost.load(Ordering::Relaxed) as f64,
        }
    }
}

/// One round of one implementation.
#[derive(Clone, Copy, Debug)]
pub struct HotSample {
    pub handoffs_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Percentage of grants (after a release) to another task than the releaser.
    pub to_other_task_pct: f64,
    /// The longest single acquisition of the round, calling lock to grant.
    pub longest_wait_ms: f64,
    /// The 99th percentile of the round's acquisitions, calling lock to grant.
    pub wait_p99_ms: f64,
    /// Percentage of grants that overtook no waiter (see the module docs).
    pub in_arrival_order_pct: f64,
    /// Holds found lost at their release ([`Handoffs::released`]).
    pub lost_holds: f64,
}

impl HotSample {
    /// Each figure's median over `rounds`, separately.
    pub fn medians(rounds: &[HotSample]) -> HotSample {
        let m = |pick: fn(&HotSample) -> f64| median(rounds.iter().map(pick));
        HotSample {
            handoffs_per_s: m(|s| s.handoffs_per_s),
            p50_us: m(|s| s.p50_us),
            p99_us: m(|s| s.p99_us),
            to_other_task_pct: m(|s| s.to_other_task_pct),
            longest_wait_ms: m(|s| s.longest_wait_ms),
            wait_p99_ms: m(|s| s.wait_p99_ms),
            in_arrival_order_pct: m(|s| s.in_arrival_order_pct),
            lost_holds: m(|s| s.lost_holds),
        }
    }
}

/// One acquire/release by task `task`, calling [`Handoffs::granted`] once it holds the
/// lock (with the instant it called lock) and [`Handoffs::releasing`] right before it
/// releases.
pub type HotCycle = Arc<dyn Fn(usize, Arc<Handoffs>) -> BoxFut<()> + Send + Sync>;

/// One implementation under test; `name` as in `hot_key <name> ...`.
struct Impl {
    name: &'static str,
    cycle: HotCycle,
}

/// `tasks` tasks running `cycle` until `until`, recorded in `stats`.
async fn run_until(
    cycle: &HotCycle,
    tasks: usize,
    stats: &Arc<Handoffs>,
    until: Instant,
) -> Result<(), BoxError> {
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let (cycle, stats) = (cycle.clone(), stats.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    cycle(t, stats.clone()).await?;
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

/// Warms `tasks` copies of `cycle` up for `warm` (not recorded), then measures them
/// for `measure`.
pub async fn measure(
    cycle: &HotCycle,
    tasks: usize,
    warm: Duration,
    measure: Duration,
) -> Result<HotSample, BoxError> {
    run_until(cycle, tasks, &Arc::default(), Instant::now() + warm).await?;
    let stats = Arc::new(Handoffs::default());
    let start = Instant::now();
    run_until(cycle, tasks, &stats, start + measure).await?;
    Ok(stats.sample(start.elapsed()))
}

/// Prints implementation `name`'s medians `m` and its per-round rates from `rounds`.
pub fn print(name: &str, m: &HotSample, rounds: &[HotSample]) {
    println!("hot_key {name} handoffs_per_s {:.0}", m.handoffs_per_s);
    println!(
        "hot_key {name} handoff_p50_us {:.0} handoff_p99_us {:.0}",
        m.p50_us, m.p99_us
    );
    println!(
        "hot_key {name} handoffs_to_other_task_pct {:.1}",
        m.to_other_task_pct
    );
    println!(
        "hot_key {name} longest_wait_ms {:.1} wait_p99_ms {:.1}",
        m.longest_wait_ms, m.wait_p99_ms
    );
    println!(
        "hot_key {name} in_arrival_order_pct {:.1}",
        m.in_arrival_order_pct
    );
    println!(
        "hot_key {name} handoffs_per_s_rounds {}",
        rounds_list(rounds.iter().map(|s| s.handoffs_per_s))
    );
    let lost: f64 = rounds.iter().map(|s| s.lost_holds).sum();
    if lost > 0.0 {
        println!("hot_key {name} lost_holds {lost:.0} (over all rounds)");
    }
}

/// lock-core with the tasks spread over `clients` LockClients (more than one client
/// means some handoffs cross the pub/sub connection instead of the in-process wake-up);
/// `fair`: a fair lock, granted in arrival order.
async fn ours(url: &str, clients: usize, fair: bool) -> Result<HotCycle, BoxError> {
    let mut pool = Vec::new();
    for _ in 0..clients {
        pool.push(LockClient::open_with_config(url, LockConfig::new()).await?);
    }
    let mut opts = LockOptions::new()
        .wait(Duration::from_secs(30))
        .lease(Lease::Fixed(Duration::from_secs(10)));
    if fair {
        opts = opts.fair();
    }
    let kind = if fair { "fair" } else { "hot" };
    Ok(Arc::new(move |t, stats: Arc<Handoffs>| {
        let (client, opts) = (pool[t % clients].clone(), opts.clone());
        Box::pin(async move {
            let called = stats.calling();
            let g = client.acquire(("bench", kind, clients), opts).await?;
            stats.granted(t, called);
            stats.releasing(t);
            stats.released(g.release().await)
        })
    }))
}

fn rslock(url: &str) -> HotCycle {
    let rslock = rslock::LockManager::new(vec![url.to_string()]);
    Arc::new(move |t, stats: Arc<Handoffs>| {
        let rslock = rslock.clone();
        Box::pin(async move {
            let called = stats.calling();
            let lock = rslock
                .acquire_no_guard(&b"bench:rslock:hot"[..], Duration::from_secs(10))
                .await
                .map_err(|e| format!("rslock: {e:?}"))?;
            stats.granted(t, called);
            stats.releasing(t);
            rslock.unlock(&lock).await;
            Ok(())
        })
    })
}

/// Measures lock-core with 1 and 4 clients and rslock, `rounds` interleaved rounds
/// each; prints the medians, the per-round rates and each ratio's line (the median of
/// the per-round ratios, their spread, and a `disturbed` line when they disagree).
pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let impls = [
        Impl {
            name: "ours_1_clients",
            cycle: ours(url, 1, false).await?,
        },
        Impl {
            name: "ours_4_clients",
            cycle: ours(url, 4, false).await?,
        },
        Impl {
            name: "ours_fair_4_clients",
            cycle: ours(url, 4, true).await?,
        },
        Impl {
            name: "rslock",
            cycle: rslock(url),
        },
    ];
    let mut samples: Vec<Vec<HotSample>> = vec![Vec::with_capacity(rounds); impls.len()];
    for round in 0..rounds {
        for i in round_order(impls.len(), round) {
            let s = measure(&impls[i].cycle, TASKS, timing.warm(round), timing.measure).await?;
            samples[i].push(s);
        }
    }
    let medians: Vec<HotSample> = samples.iter().map(|s| HotSample::medians(s)).collect();
    for ((imp, s), m) in impls.iter().zip(&samples).zip(&medians) {
        print(imp.name, m, s);
    }
    let per_round = |i: usize, pick: fn(&HotSample) -> f64| -> Vec<f64> {
        samples[i].iter().map(pick).collect()
    };
    let handoffs = |name: &str, a: usize| {
        let rate = |s: &HotSample| s.handoffs_per_s;
        Figure::rounds(
            name,
            "handoffs/s",
            &per_round(a, rate),
            &per_round(PEER, rate),
        )
    };
    let table = [
        handoffs("hot_handoffs_ours_1_client_vs_rslock", ONE),
        handoffs("hot_handoffs_ours_4_clients_vs_rslock", FOUR),
    ];
    let p50 = |s: &HotSample| s.p50_us;
    let wait_p99 = |s: &HotSample| s.wait_p99_ms;
    let rate = |s: &HotSample| s.handoffs_per_s;
    let printed = [
        Figure::lower_is_better(
            "hot_handoff_p50_ours_1_client_vs_rslock",
            "us",
            &per_round(ONE, p50),
            &per_round(PEER, p50),
        ),
        // What the line costs and gives against the plain lock on the same 4 clients.
        Figure::rounds(
            "hot_handoffs_fair_vs_plain_4_clients",
            "handoffs/s",
            &per_round(FAIR, rate),
            &per_round(FOUR, rate),
        ),
        Figure::lower_is_better(
            "hot_wait_p99_fair_vs_plain_4_clients",
            "ms",
            &per_round(FAIR, wait_p99),
            &per_round(FOUR, wait_p99),
        ),
    ];
    for f in table.iter().chain(&printed) {
        println!("{}", f.ratio_line());
    }
    let mut figures = table.to_vec();
    figures.extend(printed.iter().skip(1).cloned());
    // Fairness has no baseline to compare with: shown, not judged.
    for (imp, m) in impls.iter().zip(&medians) {
        let unbased = [
            ("handoffs_to_other_task_pct", m.to_other_task_pct, "%"),
            ("longest_wait_ms", m.longest_wait_ms, "ms"),
            ("wait_p99_ms", m.wait_p99_ms, "ms"),
            ("in_arrival_order_pct", m.in_arrival_order_pct, "%"),
        ];
        for (figure, value, unit) in unbased {
            let name = format!("hot_{}_{figure}", imp.name);
            figures.push(Figure::alone(name, value, unit));
        }
    }
    Ok(figures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_lost_before_its_release_is_counted_and_any_other_error_ends_the_round() {
        let stats = Handoffs::default();
        let key = || "bench:hot".to_owned();
        assert!(stats.released(Ok::<(), LockError>(())).is_ok());
        assert!(
            stats
                .released::<()>(Err(LockError::Expired { key: key() }))
                .is_ok()
        );
        assert!(
            stats
                .released::<()>(Err(LockError::NotOwner { key: key() }))
                .is_ok()
        );
        let other = stats.released::<()>(Err(LockError::InvalidConfig("lease".into())));
        assert!(other.is_err_and(|e| e.to_string().contains("lease")));
        assert_eq!(stats.sample(Duration::from_secs(1)).lost_holds, 2.0);
    }
}
