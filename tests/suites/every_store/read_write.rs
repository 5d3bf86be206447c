//! Read-write locks on every store that has them, against real servers.
//!
//! A seeded randomized model: tasks in a few scopes on two handles take read and write
//! holds of a few names (some cancelled, some timing out), re-enter, drop and release
//! them; a checker looks at every hold alive, over and over, and fails on any instant
//! where a writer with validity left shares its name with a hold of another scope
//! (reader or writer) with validity left. It also counts the instants where readers of
//! different scopes held one name together, so a store that made every hold exclusive
//! fails too. Reproduce a failure with `MODEL_SEED=<seed> cargo test -p lock-tests
//! --test every_store -- read_write::`.
//!
//! Then the promises one by one: waiting writers hold new readers back (and a writer
//! that left stops doing so), an upgrade is refused, a downgrade where the store has
//! one, and stores without read-write locks refuse them before any call.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{AnyGuard, AnyLocks, HeldLock, Lease, LockError, LockMode, LockOptions, LockScope};
use lock_tests::{MariaDbServer, RedisServer};

use super::model::{self, Backend, seed};
use crate::common;

const NAMES: [&str; 2] = ["shelf", "ledger"];
/// Holds one task keeps at most.
const MAX_HOLDS: usize = 3;
/// A hold counts only with this much validity left, so that the checker's own delay
/// cannot make a true belief look false.
const MARGIN: Duration = Duration::from_millis(3);

/// The holds one task has right now, with their mode, where the checker sees them.
type Holds = Arc<Mutex<Vec<(LockMode, AnyGuard)>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One task's random walk for `run_for`: answers its steps and the upgrades refused.
async fn walk(
    locks: AnyLocks,
    fixed_leases: bool,
    scope: LockScope,
    holds: Holds,
    seed: u64,
    run_for: Duration,
) -> u64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let until = Instant::now() + run_for;
    let mut steps = 0;
    let take = |g: Option<(LockMode, AnyGuard)>| {
        if let Some(g) = g {
            lock(&holds).push(g);
        }
    };
    let pick = |rng: &mut fastrand::Rng| {
        let mut h = lock(&holds);
        let n = h.len();
        (n > 0).then(|| h.swap_remove(rng.usize(0..n)))
    };
    // Readers only for the last third, so readers of different scopes surely meet:
    // while writers wait, they hold new readers back for long stretches, by design.
    let readers_only = until - run_for / 3;
    let mut mixed = true;
    while Instant::now() < until {
        steps += 1;
        if mixed && Instant::now() >= readers_only {
            // Every writer's hold goes at the turn, so readers may meet.
            mixed = false;
            let all: Vec<_> = lock(&holds).drain(..).collect();
            for (_, g) in all {
                let _ = g.release().await;
            }
        }
        let name = NAMES[rng.usize(0..NAMES.len())];
        // Until then, readers come twice as often as writers.
        let mode = if mixed && rng.u8(0..3) == 0 {
            LockMode::Write
        } else {
            LockMode::Read
        };
        // A task keeps at most a few holds, so names change hands.
        let step = match rng.u8(0..10) {
            0..=3 if lock(&holds).len() >= MAX_HOLDS => 6,
            step => step,
        };
        match step {
            0..=2 => {
                let options = model::options(&mut rng, fixed_leases)
                    .mode(mode)
                    .scope(&scope);
                match locks.acquire(name, options).await {
                    Ok(g) => take(Some((mode, g))),
                    Err(e) => assert!(
                        !matches!(e, LockError::Unsupported { .. }) || mode == LockMode::Read,
                        "only a downgrade may be unsupported here: {e}"
                    ),
                }
            }
            3 => {
                let cut = Duration::from_micros(rng.u64(0..3000));
                let options = model::options(&mut rng, fixed_leases)
                    .mode(mode)
                    .scope(&scope);
                if let Ok(Ok(g)) = tokio::time::timeout(cut, locks.acquire(name, options)).await {
                    take(Some((mode, g)));
                }
            }
            4 => {
                if let Some((mode, g)) = pick(&mut rng) {
                    if let Some(again) = model::reenter(&g).await {
                        take(Some((mode, again)));
                    }
                    take(Some((mode, g)));
                }
            }
            5 => drop(pick(&mut rng)),
            6 | 7 => {
                if let Some((_, g)) = pick(&mut rng) {
                    if rng.bool() {
                        let _ = g.release().await;
                    } else {
                        let cut = Duration::from_micros(rng.u64(0..2000));
                        let _ = tokio::time::timeout(cut, g.release()).await;
                    }
                }
            }
            _ => tokio::time::sleep(ms(rng.u64(0..8))).await,
        }
    }
    let rest: Vec<_> = lock(&holds).drain(..).collect();
    for (_, g) in rest {
        let _ = g.release().await;
    }
    steps
}

/// One look at every hold alive: a violation, if any; counts in `seen` the names that
/// readers of two scopes held together, and those a writer held.
fn check(tasks: &[(usize, Holds)], seen: &mut (u64, u64)) -> Option<String> {
    for name in NAMES {
        // (scope, mode, what) of every hold that believes it holds `name`.
        let mut believers = Vec::new();
        // Every task's holds at one instant (see `model::check`).
        let all: Vec<_> = tasks
            .iter()
            .map(|(scope, holds)| (*scope, lock(holds)))
            .collect();
        for (scope, holds) in &all {
            for (mode, g) in holds.iter().filter(|(_, g)| g.name() == name) {
                if g.valid_for() > MARGIN {
                    believers.push((*scope, *mode, format!("{g:?}")));
                }
            }
        }
        for (scope, mode, what) in &believers {
            if *mode != LockMode::Write {
                continue;
            }
            seen.1 += 1;
            if let Some(other) = believers.iter().find(|b| b.0 != *scope) {
                return Some(format!(
                    "the writer {what} (scope {scope}) shares {name} with {other:?}"
                ));
            }
        }
        let mut readers: Vec<usize> = believers
            .iter()
            .filter(|b| b.1 == LockMode::Read)
            .map(|b| b.0)
            .collect();
        readers.sort_unstable();
        readers.dedup();
        if readers.len() > 1 {
            seen.0 += 1;
        }
    }
    None
}

async fn run_model(backend: Backend, seed: u64, run_for: Duration) {
    // 2 scopes on the first handle shared by 2 tasks each, 3 scopes of one task on the
    // second; a task's scope number tells scopes apart for the checker.
    let mut plan = Vec::new();
    for _ in 0..2 {
        let scope = LockScope::new();
        plan.push((0, plan.len(), scope.clone()));
        plan.push((0, plan.len() - 1, scope));
    }
    for _ in 0..3 {
        plan.push((1, plan.len(), LockScope::new()));
    }
    let tasks: Vec<(usize, Holds)> = plan
        .iter()
        .map(|(_, scope, _)| (*scope, Holds::default()))
        .collect();
    let walkers: Vec<_> = plan
        .into_iter()
        .zip(&tasks)
        .enumerate()
        .map(|(i, ((h, _, scope), (_, holds)))| {
            tokio::spawn(walk(
                backend.locks[h].clone(),
                backend.fixed_leases,
                scope,
                holds.clone(),
                seed.wrapping_mul(31).wrapping_add(i as u64),
                run_for,
            ))
        })
        .collect();
    let mut seen = (0, 0);
    let (steps, checks) = model::watch(walkers, seed, async || check(&tasks, &mut seen)).await;
    let (shared, written) = seen;
    println!(
        "seed {seed}: {steps} steps, {checks} checks, {shared} shared, {written} written, \
         no violation"
    );
    assert!(steps > 300, "too few steps ({steps}) to mean anything");
    assert!(checks > 100, "too few checks ({checks})");
    assert!(
        shared > 0,
        "readers of two scopes never held a name together"
    );
    for locks in &backend.locks {
        common::eventually(Duration::from_secs(5), "every hold given back", || async {
            model::held_count(locks) == 0
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_never_a_writer_beside_anyone() {
    run_model(model::memory(), seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_never_a_writer_beside_anyone() {
    run_model(model::redis(true).await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_never_a_writer_beside_anyone() {
    run_model(model::cluster().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_never_a_writer_beside_anyone() {
    run_model(model::redisson(false).await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_never_a_writer_beside_anyone() {
    run_model(model::postgres().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_never_a_writer_beside_anyone() {
    run_model(model::zookeeper().await, seed(), Duration::from_secs(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_never_a_writer_beside_anyone() {
    run_model(model::etcd().await, seed(), Duration::from_secs(3)).await;
}

/// The checker can fail: two memory stores that do not share exclude nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "shares")]
async fn unrelated_stores_are_caught_with_a_writer_beside_a_reader() {
    let mut backend = model::memory();
    backend.locks[1] = model::memory().locks[1].clone();
    run_model(backend, seed(), Duration::from_secs(3)).await;
}

fn read() -> LockOptions {
    LockOptions::new().read()
}

fn write() -> LockOptions {
    LockOptions::new().write()
}

/// Takes `name` with `options` at once in `scope`, or says why not.
async fn now(
    locks: &AnyLocks,
    name: &str,
    options: LockOptions,
    scope: &LockScope,
) -> Result<AnyGuard, LockError> {
    locks
        .acquire(name, options.wait(Duration::ZERO).scope(scope))
        .await
}

/// Readers share, a writer is alone, and once a writer waits new readers wait too;
/// a writer that stops waiting stops holding them back.
async fn readers_share_and_a_waiting_writer_holds_new_readers_back(backend: Backend) {
    let [a, b] = &backend.locks;
    let (s1, s2, s3) = (LockScope::new(), LockScope::new(), LockScope::new());
    let r1 = now(a, "doc", read(), &s1).await.expect("a first reader");
    let r2 = now(b, "doc", read(), &s2).await.expect("readers share");
    let busy = now(b, "doc", write(), &s3)
        .await
        .expect_err("no writer beside readers");
    assert!(busy.is_busy(), "{busy}");
    r2.release().await.unwrap();

    // A writer waits for r1: from its first attempt on, new readers wait as well.
    let writer = {
        let (b, s3) = (b.clone(), s3.clone());
        tokio::spawn(async move {
            b.acquire("doc", write().wait(Duration::from_secs(20)).scope(&s3))
                .await
        })
    };
    common::eventually(Duration::from_secs(10), "a new reader refused", || async {
        match now(b, "doc", read(), &s2).await {
            Ok(g) => {
                g.release().await.unwrap();
                false
            }
            Err(e) => {
                assert!(e.is_busy(), "{e}");
                true
            }
        }
    })
    .await;
    assert!(!writer.is_finished(), "the writer waits for the reader");
    r1.release().await.unwrap();
    let w = writer
        .await
        .unwrap()
        .expect("the writer gets it once readers are gone");
    assert!(w.token().is_some(), "a writer is fenced");
    assert!(now(a, "doc", read(), &s1).await.unwrap_err().is_busy());
    w.release().await.unwrap();
    now(a, "doc", read(), &s1)
        .await
        .expect("readers again")
        .release()
        .await
        .unwrap();

    // A writer that gives up: readers come back within a bounded time.
    let r1 = now(a, "doc", read(), &s1).await.unwrap();
    let gave_up = b
        .acquire("doc", write().wait(ms(300)).scope(&s3))
        .await
        .expect_err("the reader holds it");
    assert!(gave_up.is_timeout(), "{gave_up}");
    let waited = common::eventually(Duration::from_secs(10), "readers let in again", || async {
        match now(b, "doc", read(), &s2).await {
            Ok(g) => g.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    println!("readers held back {waited:?} after the writer left");
    r1.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_readers_share_and_waiting_writers_come_first() {
    readers_share_and_a_waiting_writer_holds_new_readers_back(model::memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_readers_share_and_waiting_writers_come_first() {
    readers_share_and_a_waiting_writer_holds_new_readers_back(model::redis(true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_readers_share_and_waiting_writers_come_first() {
    readers_share_and_a_waiting_writer_holds_new_readers_back(model::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_readers_share_and_waiting_writers_come_first() {
    readers_share_and_a_waiting_writer_holds_new_readers_back(model::zookeeper().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_readers_share_and_waiting_writers_come_first() {
    readers_share_and_a_waiting_writer_holds_new_readers_back(model::etcd().await).await;
}

/// A scope's read hold cannot grow into the write hold; its write hold may take a read
/// hold (where the store downgrades), which outlives the write hold.
async fn upgrade_refused_and_downgrade(backend: Backend, downgrades: bool) {
    let [a, b] = &backend.locks;
    let (s1, s2) = (LockScope::new(), LockScope::new());
    let r = now(a, "page", read(), &s1).await.unwrap();
    let upgrade = a
        .acquire("page", write().wait(Duration::from_secs(5)).scope(&s1))
        .await
        .expect_err("an upgrade would wait for itself");
    assert!(matches!(upgrade, LockError::Upgrade { .. }), "{upgrade}");
    let again = now(a, "page", read(), &s1)
        .await
        .expect("a reader re-enters");
    drop(again);
    r.release().await.unwrap();

    let w = now(a, "page", write(), &s1).await.unwrap();
    let down = now(a, "page", read(), &s1).await;
    if !downgrades {
        let e = down.expect_err("this store cannot downgrade");
        assert!(matches!(e, LockError::Unsupported { .. }), "{e}");
        w.release().await.unwrap();
        return;
    }
    let down = down.expect("the writer's scope reads beside it");
    let rewrite = now(a, "page", write(), &s1)
        .await
        .expect("the writer re-enters");
    drop(rewrite);
    assert!(now(b, "page", read(), &s2).await.unwrap_err().is_busy());
    w.release().await.unwrap();
    let other = now(b, "page", read(), &s2)
        .await
        .expect("the lock is read-held now");
    assert!(
        now(b, "page", write(), &LockScope::new())
            .await
            .unwrap_err()
            .is_busy()
    );
    down.release().await.unwrap();
    other.release().await.unwrap();
    now(b, "page", write(), &s2)
        .await
        .expect("free")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_refuses_an_upgrade_and_downgrades() {
    upgrade_refused_and_downgrade(model::memory(), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_refuses_an_upgrade_and_downgrades() {
    upgrade_refused_and_downgrade(model::redis(false).await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_refuses_an_upgrade_and_downgrades() {
    upgrade_refused_and_downgrade(model::redisson(false).await, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refuses_an_upgrade_and_a_downgrade() {
    upgrade_refused_and_downgrade(model::postgres().await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_refuses_an_upgrade_and_a_downgrade() {
    upgrade_refused_and_downgrade(model::zookeeper().await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_refuses_an_upgrade_and_a_downgrade() {
    upgrade_refused_and_downgrade(model::etcd().await, false).await;
}

/// A read-write lock is its own lock: the plain lock of the same name is another. A
/// plain holder and a writer or readers of one name hold at once, whichever came first.
async fn plain_and_read_write_are_two_locks(backend: model::Backend) {
    let [a, b] = &backend.locks;
    for rw_first in [false, true] {
        for mode in [read(), write()] {
            let (first, second) = if rw_first {
                (mode, LockOptions::new())
            } else {
                (LockOptions::new(), mode)
            };
            let held = now(a, "both", first, &LockScope::new()).await.unwrap();
            let beside = now(b, "both", second, &LockScope::new())
                .await
                .expect("the other kind of lock is free");
            beside.release().await.unwrap();
            held.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_read_write_locks_of_one_name_are_two_locks_on_memory_and_redis() {
    plain_and_read_write_are_two_locks(model::memory()).await;
    plain_and_read_write_are_two_locks(model::redis(true).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_read_write_locks_of_one_name_are_two_locks_on_postgres() {
    plain_and_read_write_are_two_locks(model::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_read_write_locks_of_one_name_are_two_locks_on_zookeeper() {
    plain_and_read_write_are_two_locks(model::zookeeper().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_and_read_write_locks_of_one_name_are_two_locks_on_etcd() {
    plain_and_read_write_are_two_locks(model::etcd().await).await;
}

/// Stores without read-write locks say so before any call, whatever the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_without_shared_holds_refuse_them_clearly() {
    let maria = MariaDbServer::start();
    let masters = RedisServer::start_many(3);
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    for url in [maria.url(), format!("redlock://{}", hosts.join(","))] {
        let locks = AnyLocks::open(&url, lock_core::LockConfig::new())
            .await
            .expect(&url);
        for options in [read(), write()] {
            let e = locks
                .acquire("x", options.wait(Duration::from_secs(30)))
                .await
                .expect_err("no read-write locks here");
            assert!(matches!(e, LockError::Unsupported { .. }), "{url}: {e}");
            assert!(e.to_string().contains("no read or write holds"), "{e}");
        }
        locks
            .acquire("x", LockOptions::new())
            .await
            .expect("plain locks still work")
            .release()
            .await
            .unwrap();
    }
}

/// A hold that ran out and is given back late must not give back a newer hold of the
/// same scope, in any mode (Redisson's layout counts an owner's holds in one field).
async fn a_late_release_of_a_lapsed_hold_leaves_the_newer_one(backend: model::Backend) {
    let [a, b] = &backend.locks;
    for (mode, options) in [
        ("read", read()),
        ("write", write()),
        ("plain", LockOptions::new()),
    ] {
        let scope = LockScope::new();
        let name = format!("late-{mode}");
        let lapsed = now(
            a,
            &name,
            options.clone().lease(Lease::Fixed(ms(50))),
            &scope,
        )
        .await
        .unwrap();
        common::eventually(Duration::from_secs(2), "the short lease lapses", || async {
            lapsed.valid_for() == Duration::ZERO
        })
        .await;
        // Readers share: a writer must wait. A writer or a plain holder: anyone must.
        let excluded = || {
            if mode == "read" {
                write()
            } else {
                options.clone()
            }
        };
        // Until the store's lease ran out too, so the newer hold is a grant of its own.
        common::eventually(Duration::from_secs(2), "the store lets it go", || async {
            match now(b, &name, excluded(), &LockScope::new()).await {
                Ok(g) => g.release().await.is_ok(),
                Err(_) => false,
            }
        })
        .await;
        let long = Lease::Fixed(Duration::from_secs(10));
        let newer = now(a, &name, options.clone().lease(long), &scope)
            .await
            .unwrap();
        assert!(
            lapsed.release().await.is_err(),
            "{mode}: the lapsed hold is lost"
        );
        let other = now(b, &name, excluded(), &LockScope::new()).await;
        assert!(
            other.is_err(),
            "{mode}: another owner got in beside a hold with {:?} left",
            newer.valid_for()
        );
        newer.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_a_late_release_of_a_lapsed_hold_leaves_the_newer_one() {
    a_late_release_of_a_lapsed_hold_leaves_the_newer_one(model::redisson(false).await).await;
}
