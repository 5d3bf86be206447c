//! A seeded randomized test against a model: many tasks in a few scopes on two clients
//! interleave lock / re-enter / drop / release / cancel / timeout on a few names, with
//! short leases, against a real redis-server. A checker looks at every guard alive,
//! over and over, and fails on any instant where
//! - two different grants of one name both believe they hold it (`valid_for()` left), or
//! - a guard believes it holds a name while the server shows another grant (or none).
//!
//! Reproduce a failure with `MODEL_SEED=<seed> cargo test -p lock-tests --test
//! every_store -- model::`; the seed is printed at the start of every run.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::client;
use lock_core::{Lease, LockClient, LockConfig, LockGuard, LockOptions, LockScope};
use lock_tests::RedisServer;

const NAMES: [&str; 3] = ["alpha", "beta", "gamma"];
/// A guard counts as believing it holds only with this much validity left, so that
/// the checker's own delay cannot make a true belief look false.
const MARGIN: Duration = Duration::from_millis(3);

/// The guards one task holds right now, where the checker can see them.
type Held = Arc<Mutex<Vec<LockGuard>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn options(rng: &mut fastrand::Rng) -> LockOptions {
    let lease = if rng.bool() {
        Lease::Watchdog
    } else {
        Lease::Fixed(Duration::from_millis(rng.u64(30..300)))
    };
    let wait = if rng.u8(0..3) == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(rng.u64(1..60))
    };
    LockOptions::new().lease(lease).wait(wait)
}

/// One task's random walk for `run_for`.
async fn walk(
    client: LockClient,
    scope: LockScope,
    held: Held,
    seed: u64,
    run_for: Duration,
) -> u64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let until = Instant::now() + run_for;
    let mut steps = 0;
    while Instant::now() < until {
        steps += 1;
        let name = NAMES[rng.usize(0..NAMES.len())];
        match rng.u8(0..10) {
            0..=2 => {
                if let Ok(g) = client.acquire(name, options(&mut rng).scope(&scope)).await {
                    lock(&held).push(g);
                }
            }
            3 => {
                // An acquisition cancelled somewhere in its request.
                let cut = Duration::from_micros(rng.u64(0..3000));
                let acquiring = client.acquire(name, options(&mut rng).scope(&scope));
                if let Ok(Ok(g)) = tokio::time::timeout(cut, acquiring).await {
                    lock(&held).push(g);
                }
            }
            4 => {
                let g = {
                    let mut h = lock(&held);
                    let n = h.len();
                    (n > 0).then(|| h.swap_remove(rng.usize(0..n)))
                };
                if let Some(g) = g {
                    if let Ok(again) = g.reenter().await {
                        lock(&held).push(again);
                    }
                    lock(&held).push(g);
                }
            }
            5 => {
                let mut h = lock(&held);
                let n = h.len();
                if n > 0 {
                    drop(h.swap_remove(rng.usize(0..n)));
                }
            }
            6 | 7 => {
                let g = {
                    let mut h = lock(&held);
                    let n = h.len();
                    (n > 0).then(|| h.swap_remove(rng.usize(0..n)))
                };
                if let Some(g) = g {
                    if rng.bool() {
                        let _ = g.release().await;
                    } else {
                        // A release cancelled mid-call.
                        let cut = Duration::from_micros(rng.u64(0..2000));
                        let _ = tokio::time::timeout(cut, g.release()).await;
                    }
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(rng.u64(0..8))).await,
        }
    }
    // Leave nothing held.
    let rest: Vec<LockGuard> = lock(&held).drain(..).collect();
    for g in rest {
        let _ = g.release().await;
    }
    steps
}

/// One look at every guard alive; returns a description of any violation.
async fn check(server: &RedisServer, keys: &[(String, String)], tasks: &[Held]) -> Option<String> {
    for (name, key) in keys {
        // Who believes they hold `name`, and until when.
        let t0 = Instant::now();
        let mut believers: Vec<(String, Instant, String)> = Vec::new();
        for held in tasks {
            for g in lock(held).iter().filter(|g| g.name() == name.as_str()) {
                let left = g.valid_for();
                if left > MARGIN {
                    believers.push((g.grant_value().to_owned(), t0 + left, format!("{g:?}")));
                }
            }
        }
        let mut grants: Vec<&str> = believers.iter().map(|b| b.0.as_str()).collect();
        grants.sort_unstable();
        grants.dedup();
        if grants.len() > 1 {
            return Some(format!(
                "two grants of {name} both believe they hold it: {believers:?}"
            ));
        }
        if believers.is_empty() {
            continue;
        }
        let mut c = server.connection().await;
        let value: Option<String> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap();
        let t1 = Instant::now();
        for (grant, until, what) in &believers {
            // A guard taken out and released between the look and the GET is no
            // violation: count only grants some guard still holds after the GET (a
            // grant is deleted only once its last guard is gone, and a value is never
            // granted twice).
            if t1 + MARGIN < *until
                && value.as_deref() != Some(grant.as_str())
                && still_held(tasks, grant)
            {
                return Some(format!(
                    "{what} believes it holds {name} for {:?} more, the server shows {value:?}",
                    *until - t1
                ));
            }
        }
    }
    None
}

/// Whether some guard alive now holds the grant with value `grant`.
fn still_held(tasks: &[Held], grant: &str) -> bool {
    tasks.iter().any(|held| {
        lock(held)
            .iter()
            .any(|g| g.grant_value() == grant && g.valid_for() > MARGIN)
    })
}

async fn run_model(seed: u64, run_for: Duration, batching: bool) {
    let server = RedisServer::start();
    let config = LockConfig::new()
        .with_batching(batching)
        .with_watchdog_lease(Duration::from_millis(150))
        .with_command_timeout(Duration::from_secs(2));
    let clients = [
        client(&server, config.clone()).await,
        client(&server, config).await,
    ];
    let keys: Vec<(String, String)> = NAMES
        .iter()
        .map(|n| (n.to_string(), clients[0].keys(*n).unwrap().key))
        .collect();
    // 3 scopes on the first client shared by 2 tasks each, 3 scopes of one task on
    // the second.
    let mut plan = Vec::new();
    for s in 0..3 {
        let scope = LockScope::new();
        plan.push((0, scope.clone()));
        plan.push((0, scope));
        let _ = s;
    }
    for _ in 0..3 {
        plan.push((1, LockScope::new()));
    }
    let tasks: Vec<Held> = plan.iter().map(|_| Held::default()).collect();
    let walkers: Vec<_> = plan
        .into_iter()
        .zip(&tasks)
        .enumerate()
        .map(|(i, ((c, scope), held))| {
            let client = clients[c].clone();
            tokio::spawn(walk(
                client,
                scope,
                held.clone(),
                seed.wrapping_mul(31).wrapping_add(i as u64),
                run_for,
            ))
        })
        .collect();
    let mut checks = 0u64;
    while walkers.iter().any(|w| !w.is_finished()) {
        if let Some(violation) = check(&server, &keys, &tasks).await {
            panic!("seed {seed}: {violation}");
        }
        checks += 1;
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    let mut steps = 0;
    for w in walkers {
        steps += w.await.unwrap();
    }
    println!("seed {seed}: {steps} steps, {checks} checks, no violation");
    assert!(steps > 500, "too few steps ({steps}) to mean anything");
    assert!(checks > 100, "too few checks ({checks})");
    for c in &clients {
        common::eventually(Duration::from_secs(2), "every grant given back", || async {
            c.held_count() == 0
        })
        .await;
    }
}

fn seed() -> u64 {
    let seed = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("MODEL_SEED={seed}");
    seed
}

/// With batching (the default): concurrent acquisitions and releases share script calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_owners_ever_believe_they_hold_one_name() {
    run_model(seed(), Duration::from_secs(4), true).await;
}

/// With every call its own command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_two_owners_without_batching() {
    run_model(seed(), Duration::from_secs(3), false).await;
}
