//! Leader election on every store, against real servers.
//!
//! A seeded randomized model: candidates on two handles campaign (some campaigns
//! cancelled, some timing out), lead for a while, then resign or drop their
//! leadership; a checker looks at every leadership alive, over and over, and fails on
//! any instant where two of them are leading with validity left, and on any term not
//! larger than one granted before its campaign began. Reproduce a failure with
//! `MODEL_SEED=<seed> cargo test -p lock-tests --test every_store -- election::`.
//!
//! Then `Election::run`: candidates take turns, each term larger than the last, and
//! stop when told to.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{AnyGuard, AnyLocks, Election, Leadership, LockError};

use super::model::{self, Backend, seed};

/// A leadership counts as leading only with this much validity left, so that the
/// checker's own delay cannot make a true belief look false.
const MARGIN: Duration = Duration::from_millis(3);

/// Where a candidate keeps its leadership while it leads, for the checker to see.
type Slot = Arc<Mutex<Option<Leadership<AnyGuard>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One candidate's walk until `until`: campaign, lead a while, step down. Answers how
/// many terms it led. `highest` is the largest term any candidate has seen granted.
async fn candidate(
    election: Election<AnyLocks, &'static str>,
    slot: Slot,
    highest: Arc<Mutex<u64>>,
    seed: u64,
    until: Instant,
) -> u64 {
    let redlock = matches!(election.locks(), AnyLocks::Redlock(_));
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut led = 0;
    while Instant::now() < until {
        // Every term granted before this campaign began is below the one it gets.
        let before = *lock(&highest);
        let campaign = election.campaign(ms(rng.u64(0..400)));
        let outcome = if rng.u8(0..4) == 0 {
            // Cancelled mid-campaign.
            match tokio::time::timeout(ms(rng.u64(0..50)), campaign).await {
                Ok(outcome) => outcome,
                Err(_) => continue,
            }
        } else {
            campaign.await
        };
        let leadership = match outcome {
            Ok(l) => l,
            Err(e) if e.is_timeout() || e.is_busy() => continue,
            // A Redlock whose first node, where its tokens come from, missed the grant.
            Err(LockError::NoFencingToken { .. }) if redlock => continue,
            Err(e) => panic!("seed {seed}: a campaign failed: {e}"),
        };
        let term = leadership.term().get();
        assert!(
            term > before,
            "seed {seed}: term {term} is not above {before}, the term of a leader elected \
             before its campaign"
        );
        {
            let mut h = lock(&highest);
            *h = (*h).max(term);
        }
        led += 1;
        *lock(&slot) = Some(leadership);
        tokio::time::sleep(ms(rng.u64(0..60))).await;
        let Some(leadership) = lock(&slot).take() else {
            continue;
        };
        if rng.bool() {
            // Lost meanwhile is a possible answer; anything else is not.
            if let Err(e) = leadership.resign().await {
                assert!(e.is_lost(), "seed {seed}: resigning failed: {e}");
            }
        } else {
            drop(leadership);
        }
    }
    led
}

/// Two leaderships leading with validity left, if any.
fn two_leaders(slots: &[Slot]) -> Option<String> {
    // Every slot at one instant: read one at a time, a leadership resigned after its
    // slot was read and won by a later slot's candidate would look like two.
    let all: Vec<_> = slots.iter().map(|s| lock(s)).collect();
    let leading: Vec<(usize, u64, Duration)> = all
        .iter()
        .enumerate()
        .filter_map(|(i, slot)| {
            let l = slot.as_ref()?;
            let left = l.valid_for();
            (l.is_leading() && left > MARGIN).then(|| (i, l.term().get(), left))
        })
        .collect();
    (leading.len() > 1)
        .then(|| format!("two leaders at once (candidate, term, validity left): {leading:?}"))
}

async fn run_model(backend: Backend, seed: u64, run_for: Duration) {
    let until = Instant::now() + run_for;
    let highest = Arc::new(Mutex::new(0));
    let slots: Vec<Slot> = (0..4).map(|_| Slot::default()).collect();
    let walkers: Vec<_> = slots
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            let election = Election::new(backend.locks[i % 2].clone(), "leader");
            tokio::spawn(candidate(
                election,
                slot.clone(),
                highest.clone(),
                seed.wrapping_mul(31).wrapping_add(i as u64),
                until,
            ))
        })
        .collect();
    let (terms, checks) = model::watch(walkers, seed, async || two_leaders(&slots)).await;
    println!("seed {seed}: {terms} terms, {checks} checks, never two leaders");
    assert!(terms >= 10, "too few terms ({terms}) to mean anything");
    assert!(checks > 100, "too few checks ({checks})");
}

const RUN_FOR: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_two_leaders() {
    run_model(model::redis(true).await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_never_two_leaders() {
    run_model(model::cluster().await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_never_two_leaders() {
    run_model(model::redisson(false).await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_never_two_leaders() {
    run_model(model::redlock().await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_never_two_leaders() {
    run_model(model::memory(), seed(), RUN_FOR).await;
}

/// The checks can fail: two memory stores that do not share elect two leaders, which
/// the checker sees at once or a candidate sees in a term that is not above an earlier
/// leader's (each store counts its own terms), whichever comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "leader")]
async fn two_unrelated_stores_are_caught_with_two_leaders() {
    let mut backend = model::memory();
    backend.locks[1] = model::memory().locks[1].clone();
    run_model(backend, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_never_two_leaders() {
    run_model(model::postgres().await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_never_two_leaders() {
    run_model(model::mysql().await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_never_two_leaders() {
    run_model(model::zookeeper().await, seed(), RUN_FOR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_never_two_leaders() {
    run_model(model::etcd().await, seed(), RUN_FOR).await;
}

/// Two candidates `run` until 12 terms were led in all: each term's work sees a term
/// larger than every earlier one, terms never overlap, and both loops return once
/// their work says to stop.
async fn take_turns(backend: Backend) {
    let terms: Arc<Mutex<Vec<u64>>> = Arc::default();
    let leading = Arc::new(Mutex::new(false));
    let runs: Vec<_> = (0..2)
        .map(|i| {
            let election = Election::new(backend.locks[i].clone(), "turns");
            let (terms, leading) = (terms.clone(), leading.clone());
            tokio::spawn(async move {
                election
                    .run(|term| {
                        let (terms, leading) = (terms.clone(), leading.clone());
                        async move {
                            if lock(&terms).len() >= 12 {
                                return ControlFlow::Break(());
                            }
                            assert!(
                                !std::mem::replace(&mut *lock(&leading), true),
                                "two terms at once"
                            );
                            lock(&terms).push(term.get());
                            tokio::time::sleep(ms(20)).await;
                            *lock(&leading) = false;
                            ControlFlow::Continue(())
                        }
                    })
                    .await
            })
        })
        .collect();
    for r in runs {
        tokio::time::timeout(Duration::from_secs(30), r)
            .await
            .expect("run returned once told to stop")
            .unwrap()
            .unwrap();
    }
    let terms = lock(&terms).clone();
    assert!(terms.len() >= 12, "{terms:?}");
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms did not grow: {terms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_candidates_take_turns() {
    take_turns(model::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_candidates_take_turns() {
    take_turns(model::redis(true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_candidates_take_turns() {
    take_turns(model::etcd().await).await;
}

/// A candidate's value needs a store that keeps one: elsewhere its campaign says so
/// before any call, and `run` returns that error rather than campaign forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_values_refuses_a_candidates_value() {
    let backend = model::memory();
    let election = Election::new(backend.locks[0].clone(), "x").value("10.0.0.7:8080");
    let e = election.campaign(Duration::ZERO).await.unwrap_err();
    assert!(matches!(e, LockError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("keeps no value"), "{e}");
    let e = election
        .run(|_| async { ControlFlow::Break(()) })
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::Unsupported { .. }), "{e}");
}

/// The leader's work stops at its first await once the lease has run out: a pause
/// longer than the lease (a stalled process: here its Redis stopped, so no renewal is
/// answered, and its task blocked) ends with the loss, never with one more step of the
/// work, whichever of the two `run` would poll first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leaders_work_takes_no_step_after_its_lease() {
    let server = Arc::new(lock_tests::RedisServer::start());
    let short = lock_core::LockConfig::new().with_watchdog_lease(ms(100));
    let c = crate::common::client(&server, short).await;
    let steps_after = Arc::new(Mutex::new(0));
    for i in 0..30 {
        let election = Election::new(c.clone(), format!("paused-{i}")).rejoin_after_loss(false);
        let outcome = election
            .run(|_term| {
                let (steps_after, server) = (steps_after.clone(), server.clone());
                async move {
                    server.pause();
                    std::thread::sleep(ms(150));
                    server.resume();
                    tokio::task::yield_now().await;
                    *lock(&steps_after) += 1;
                    ControlFlow::Break(())
                }
            })
            .await;
        assert!(
            matches!(outcome, Err(LockError::Expired { .. })),
            "run {i}: {outcome:?}"
        );
    }
    assert_eq!(
        *lock(&steps_after),
        0,
        "the work went on after the lease had run out"
    );
}
