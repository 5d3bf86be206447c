//! The in-memory store: the lock promises, on tokio's paused clock (deterministic).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_core::{
    DistributedLock, Lease, LockConfig, LockError, LockMode, LockOptions, LockScope, MemoryGuard,
    MemoryLocks, Released,
};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

fn fixed(ms: u64) -> LockOptions {
    LockOptions::new().lease(Lease::Fixed(MS(ms)))
}

#[tokio::test(start_paused = true)]
async fn busy_then_a_release_wakes_the_waiter_at_once() {
    let locks = MemoryLocks::new();
    let holder = locks.acquire("x", fixed(5_000)).await.unwrap();
    match locks.try_lock("x").await {
        Err(LockError::Busy { retry_after, .. }) => assert_eq!(retry_after, MS(5_000)),
        other => panic!("expected busy, got {other:?}"),
    }
    let start = Instant::now();
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("x", fixed(1_000).wait(MS(60_000))).await })
    };
    tokio::time::sleep(MS(300)).await;
    assert_eq!(holder.release().await.unwrap(), Released::Unlocked);
    let got = waiter.await.unwrap().unwrap();
    // Woken by the release, not by the holder's lease end.
    assert_eq!(start.elapsed(), MS(300));
    assert!(got.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_with_the_budget() {
    let locks = MemoryLocks::new();
    let _holder = locks.lock("x").await.unwrap();
    let start = Instant::now();
    let err = locks
        .acquire("x", LockOptions::new().wait(MS(250)))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(start.elapsed(), MS(250));
}

#[tokio::test(start_paused = true)]
async fn a_fixed_lease_ends_lost_fires_and_another_owner_gets_in() {
    let locks = MemoryLocks::new();
    let first = locks.acquire("x", fixed(1_000)).await.unwrap();
    let t1 = first.fencing_token().unwrap();
    let start = Instant::now();
    first.lost().await;
    assert_eq!(start.elapsed(), MS(1_000));
    assert!(!first.is_held());
    assert_eq!(first.valid_for(), Duration::ZERO);
    let second = locks.try_lock("x").await.unwrap();
    assert!(second.fencing_token().unwrap() > t1, "tokens grow");
    let err = first.release().await.unwrap_err();
    assert!(err.is_not_owner(), "{err}");
    second.release().await.unwrap();
    // Lost with nobody in: expired.
    let third = locks.acquire("x", fixed(10)).await.unwrap();
    tokio::time::sleep(MS(20)).await;
    assert!(third.release().await.unwrap_err().is_expired());
}

/// Past its lease, a grant's token is refused as lost (through the trait too, where
/// `Ok(None)` would say the store has no tokens and invite an unfenced write).
#[tokio::test(start_paused = true)]
async fn a_grant_past_its_lease_hands_out_no_token() {
    let locks = MemoryLocks::new();
    let g = locks.acquire("x", fixed(100)).await.unwrap();
    assert!(g.fence().await.is_ok());
    g.lost().await;
    let err = g.fence().await.unwrap_err();
    assert!(err.is_expired(), "{err}");
    assert!(lock_core::HeldLock::fence(&g).await.is_err());
    let other = locks.acquire("y", fixed(100)).await.unwrap();
    tokio::time::sleep(MS(200)).await;
    assert!(
        lock_core::HeldLock::fence(&other)
            .await
            .unwrap_err()
            .is_expired()
    );
}

#[tokio::test(start_paused = true)]
async fn reentrancy_per_scope_and_drop_then_relock_keeps_others_out() {
    let locks = MemoryLocks::new();
    let scope = LockScope::new();
    let in_scope = |ms| fixed(ms).scope(&scope);
    let outer = locks.acquire("x", in_scope(1_000)).await.unwrap();
    let inner = locks.acquire("x", in_scope(30_000)).await.unwrap();
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert!(locks.try_lock("x").await.unwrap_err().is_busy());
    assert_eq!(
        inner.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    );
    // Drop the last hold and take it again at once in the same scope: a fresh grant,
    // and nobody else gets in between or after.
    drop(outer);
    let again = locks.acquire("x", in_scope(1_000)).await.unwrap();
    assert!(again.is_held());
    assert!(locks.try_lock("x").await.unwrap_err().is_busy());
    assert_eq!(again.release().await.unwrap(), Released::Unlocked);
    assert_eq!(locks.held_count(), 0);
    assert_eq!(locks.entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn two_tasks_of_one_scope_share_the_grant() {
    let locks = MemoryLocks::new();
    let scope = LockScope::new();
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let (locks, scope) = (locks.clone(), scope.clone());
            tokio::spawn(async move { locks.acquire("x", LockOptions::new().scope(&scope)).await })
        })
        .collect();
    let mut guards = Vec::new();
    for t in tasks {
        guards.push(t.await.unwrap().unwrap());
    }
    assert_eq!(guards[0].fencing_token(), guards[1].fencing_token());
    assert_eq!(locks.held_count(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_wait_leaves_nothing_behind() {
    let locks = MemoryLocks::new();
    let holder = locks.lock("x").await.unwrap();
    let cut = tokio::time::timeout(
        MS(50),
        locks.acquire("x", LockOptions::new().wait(MS(10_000))),
    );
    assert!(cut.await.is_err(), "the wait was cut");
    drop(holder);
    assert_eq!(locks.held_count(), 0);
    assert_eq!(locks.entries(), 0);
}

/// Takes `n` names with a 10 ms lease, 1 ms apart, each left to expire (never
/// released): about ten are live at a time, so the table keeps at most 64 + 2 x 10.
async fn expiring_names_stay_bounded(locks: &MemoryLocks, n: u64) {
    for i in 0..n {
        locks
            .acquire(("n", i), fixed(10))
            .await
            .unwrap()
            .hold_until_expiry();
        tokio::time::advance(MS(1)).await;
    }
    assert!(
        locks.entries() <= 64 + 2 * 10,
        "{} entries",
        locks.entries()
    );
}

#[tokio::test(start_paused = true)]
async fn memory_stays_bounded_by_what_is_held() {
    let locks = MemoryLocks::new();
    expiring_names_stay_bounded(&locks, 100_000).await;
    assert_eq!(locks.held_count(), 0);
}

/// The same after a peak: a thousand locks held at once, then released. The bound
/// follows what is held now, not the most that ever was.
#[tokio::test(start_paused = true)]
async fn memory_stays_bounded_by_what_is_held_after_a_peak() {
    let locks = MemoryLocks::new();
    let mut peak = Vec::new();
    for i in 0..1_000_u64 {
        peak.push(locks.lock(("peak", i)).await.unwrap());
    }
    for g in peak {
        g.release().await.unwrap();
    }
    expiring_names_stay_bounded(&locks, 1_000).await;
}

/// A max-hold too short to hold anything is refused, per call and in the config,
/// instead of granting and ending grants in a loop for the whole wait.
#[tokio::test(start_paused = true)]
async fn a_max_hold_of_zero_is_refused() {
    let locks = MemoryLocks::new();
    let e = locks
        .acquire(
            "x",
            LockOptions::new()
                .max_hold(Duration::ZERO)
                .wait(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
    let e = MemoryLocks::with_config(LockConfig::new().with_max_hold(Some(Duration::ZERO)))
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
    // Nothing was granted meanwhile: the next token is the first.
    let g = locks.try_lock("x").await.unwrap();
    assert_eq!(g.fencing_token().unwrap().get(), 1);
}

/// Settings that would overflow the deadline arithmetic (`Duration::MAX` meaning
/// "never") are refused when the store is made, as on every other store, instead of
/// panicking inside an acquisition.
#[tokio::test(start_paused = true)]
async fn a_config_that_validate_refuses_makes_no_store() {
    let e = MemoryLocks::with_config(LockConfig::new().with_command_timeout(Duration::MAX))
        .unwrap_err();
    assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
    let e = MemoryLocks::with_config(LockConfig::new().with_delimiter("")).unwrap_err();
    assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_hold_lasts_until_released_or_max_hold() {
    let locks = MemoryLocks::with_config(LockConfig::new()).unwrap();
    let g = locks.lock("x").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    assert!(g.is_held());
    assert!(locks.try_lock("x").await.unwrap_err().is_busy());
    drop(g);
    let capped = locks
        .acquire("x", LockOptions::new().max_hold(MS(500)))
        .await
        .unwrap();
    let start = Instant::now();
    capped.lost().await;
    assert_eq!(start.elapsed(), MS(500));
}

/// The same code written once against the trait runs on the memory store.
async fn count_once<L: DistributedLock>(locks: &L, hits: &Mutex<Vec<u64>>) {
    if let Ok(g) = locks.try_lock_named("job").await {
        use lock_core::HeldLock;
        hits.lock().unwrap().push(g.token().unwrap().get());
        g.release().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn the_trait_works_on_the_memory_store() {
    let locks = MemoryLocks::new();
    let hits = Mutex::new(Vec::new());
    count_once(&locks, &hits).await;
    count_once(&&locks, &hits).await;
    let hits = hits.into_inner().unwrap();
    assert_eq!(hits.len(), 2);
    assert!(hits[1] > hits[0]);
}

/// Seeded random walk: tasks in shared and own scopes lock / re-enter / release / drop /
/// cancel on three names with short leases; at every step no two different grants of
/// one name may both believe they hold it. Deterministic on the paused clock.
#[tokio::test(start_paused = true)]
async fn model_no_two_grants_believe_they_hold_one_name() {
    let seed = std::env::var("MODEL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("MODEL_SEED={seed}");
    let locks = MemoryLocks::with_config(LockConfig::new().with_watchdog_lease(MS(150))).unwrap();
    type Held = Arc<Mutex<Vec<MemoryGuard>>>;
    let all: Vec<Held> = (0..8).map(|_| Held::default()).collect();
    let scopes = [LockScope::new(), LockScope::new()];
    let names = ["a", "b", "c"];
    let mut walkers = Vec::new();
    for (i, held) in all.iter().enumerate() {
        let (locks, held) = (locks.clone(), held.clone());
        let scope = if i < 4 {
            scopes[i % 2].clone()
        } else {
            LockScope::new()
        };
        let mut rng = fastrand::Rng::with_seed(seed.wrapping_add(i as u64));
        walkers.push(tokio::spawn(async move {
            for _ in 0..400 {
                let name = names[rng.usize(0..3)];
                let lease = if rng.bool() {
                    Lease::Watchdog
                } else {
                    Lease::Fixed(MS(rng.u64(5..200)))
                };
                let opts = LockOptions::new()
                    .lease(lease)
                    .wait(MS(rng.u64(0..50)))
                    .scope(&scope);
                match rng.u8(0..6) {
                    0 | 1 => {
                        if let Ok(g) = locks.acquire(name, opts).await {
                            held.lock().unwrap().push(g);
                        }
                    }
                    2 => {
                        let cut = MS(rng.u64(0..20));
                        if let Ok(Ok(g)) =
                            tokio::time::timeout(cut, locks.acquire(name, opts)).await
                        {
                            held.lock().unwrap().push(g);
                        }
                    }
                    3 => {
                        let g = {
                            let mut h = held.lock().unwrap();
                            let n = h.len();
                            (n > 0).then(|| h.swap_remove(rng.usize(0..n)))
                        };
                        if let Some(g) = g {
                            let _ = g.release().await;
                        }
                    }
                    4 => {
                        let g = {
                            let mut h = held.lock().unwrap();
                            let n = h.len();
                            (n > 0).then(|| h.swap_remove(rng.usize(0..n)))
                        };
                        if let Some(g) = g {
                            let again = g.reenter().await;
                            let mut h = held.lock().unwrap();
                            h.push(g);
                            if let Ok(again) = again {
                                h.push(again);
                            }
                        }
                    }
                    _ => tokio::time::sleep(MS(rng.u64(0..30))).await,
                }
            }
            held.lock().unwrap().clear();
        }));
    }
    let mut checks = 0;
    while walkers.iter().any(|w| !w.is_finished()) {
        for name in names {
            let mut believers: Vec<u64> = all
                .iter()
                .flat_map(|h| {
                    h.lock()
                        .unwrap()
                        .iter()
                        .filter(|g| g.name() == name && g.is_held())
                        .map(|g| g.fencing_token().unwrap().get())
                        .collect::<Vec<_>>()
                })
                .collect();
            believers.sort_unstable();
            believers.dedup();
            assert!(
                believers.len() <= 1,
                "seed {seed}: grants {believers:?} of {name} all believe they hold it"
            );
        }
        checks += 1;
        tokio::time::sleep(MS(1)).await;
    }
    for w in walkers {
        w.await.unwrap();
    }
    assert!(checks > 100, "{checks} checks");
    assert_eq!(locks.held_count(), 0);
    assert_eq!(locks.entries(), 0, "every grant given back");
}

/// Takes "x" with `options` under a 30 s watchdog lease, holds it `held`, and lets it
/// expire: kept until the watchdog lease ends from then, not released, not longer.
async fn left_to_expire_ends_after_the_watchdog_lease(options: LockOptions, held: Duration) {
    let lease = Duration::from_secs(30);
    let locks = MemoryLocks::with_config(LockConfig::new().with_watchdog_lease(lease)).unwrap();
    let g = locks.acquire("x", options).await.unwrap();
    tokio::time::advance(held).await;
    let start = Instant::now();
    g.hold_until_expiry();
    assert!(locks.try_lock("x").await.unwrap_err().is_busy());
    let waiter = locks
        .acquire("x", LockOptions::new().wait(Duration::from_secs(7_200)))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), lease);
    waiter.release().await.unwrap();
    assert_eq!(locks.entries(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_watchdog_hold_left_to_expire_ends_after_the_watchdog_lease() {
    left_to_expire_ends_after_the_watchdog_lease(LockOptions::new(), Duration::ZERO).await;
}

/// The same with a max-hold: the cap bounds how long the watchdog would keep it, not
/// how long a lock left to expire stays taken.
#[tokio::test(start_paused = true)]
async fn a_capped_watchdog_hold_left_to_expire_ends_after_the_watchdog_lease() {
    let capped = LockOptions::new().max_hold(Duration::from_secs(3_600));
    left_to_expire_ends_after_the_watchdog_lease(capped, Duration::from_secs(5)).await;
}

/// A fixed-lease hold of `x` and a watched re-entry of it, a minute (past the fixed
/// lease) after the re-entry.
async fn fixed_then_watched(locks: &MemoryLocks) -> (MemoryGuard, MemoryGuard) {
    let scope = LockScope::new();
    let outer = locks
        .acquire("x", fixed(1_000).scope(&scope))
        .await
        .unwrap();
    let watched = locks
        .acquire("x", LockOptions::new().lease(Lease::Watchdog).scope(&scope))
        .await
        .unwrap();
    tokio::time::sleep(MS(60_000)).await;
    (outer, watched)
}

/// A watched hold that re-enters a fixed-lease grant keeps it, as the watchdog does on
/// Redis: nobody else gets in while the watched guard lives, and it ends on release.
#[tokio::test(start_paused = true)]
async fn a_watched_reentry_keeps_a_fixed_lease_grant() {
    let locks = MemoryLocks::new();
    let (outer, watched) = fixed_then_watched(&locks).await;
    assert!(
        watched.is_held(),
        "the watched hold ended with the outer fixed lease"
    );
    assert!(locks.try_lock("x").await.unwrap_err().is_busy());
    drop(outer);
    assert!(locks.try_lock("x").await.unwrap_err().is_busy());
    assert_eq!(watched.release().await.unwrap(), Released::Unlocked);
    assert!(locks.try_lock("x").await.is_ok());
}

/// Once the watched hold that kept a fixed-lease grant is given back, nothing keeps the
/// hold left: the lock runs out one watchdog lease later, as on Redis once the
/// renewals stop.
#[tokio::test(start_paused = true)]
async fn a_fixed_hold_left_by_its_watched_reentry_runs_out_a_watchdog_lease_later() {
    let locks = MemoryLocks::new();
    let (outer, watched) = fixed_then_watched(&locks).await;
    let start = Instant::now();
    assert_eq!(
        watched.release().await.unwrap(),
        Released::StillHeld { holds_left: 1 }
    );
    assert!(outer.is_held());
    tokio::time::timeout(MS(3_600_000), outer.lost())
        .await
        .expect("the fixed hold left was kept for ever");
    assert_eq!(start.elapsed(), LockConfig::new().watchdog_lease());
    assert!(locks.try_lock("x").await.is_ok());
}

/// Capped, the watched re-entry keeps the grant to its max hold and no longer; a read
/// hold is kept the same way.
#[tokio::test(start_paused = true)]
async fn a_watched_reentry_keeps_a_fixed_lease_grant_to_its_cap() {
    let locks = MemoryLocks::new();
    let scope = LockScope::new();
    let _outer = locks
        .acquire("x", fixed(1_000).scope(&scope))
        .await
        .unwrap();
    let capped = LockOptions::new()
        .lease(Lease::Watchdog)
        .max_hold(MS(5_000));
    let watched = locks.acquire("x", capped.scope(&scope)).await.unwrap();
    let start = Instant::now();
    watched.lost().await;
    assert_eq!(start.elapsed(), MS(5_000));
    assert!(locks.try_lock("x").await.is_ok());

    let reading = LockOptions::new().mode(LockMode::Read).scope(&scope);
    let _read = locks
        .acquire("r", reading.clone().lease(Lease::Fixed(MS(1_000))))
        .await
        .unwrap();
    let watched = locks
        .acquire("r", reading.lease(Lease::Watchdog))
        .await
        .unwrap();
    tokio::time::sleep(MS(60_000)).await;
    assert!(watched.is_held());
    let writing = LockOptions::new()
        .mode(LockMode::Write)
        .wait(Duration::ZERO);
    assert!(locks.acquire("r", writing).await.unwrap_err().is_busy());
}

/// A cap no clock can reach (`Duration::MAX`, accepted for a fresh grant) on a watched
/// re-entry of a fixed-lease grant is no cap: kept until given back, without a panic.
#[tokio::test(start_paused = true)]
async fn a_watched_reentry_with_an_unreachable_cap_keeps_the_grant() {
    let locks = MemoryLocks::new();
    let scope = LockScope::new();
    let outer = locks
        .acquire("x", fixed(1_000).scope(&scope))
        .await
        .unwrap();
    let forever = LockOptions::new()
        .lease(Lease::Watchdog)
        .max_hold(Duration::MAX)
        .scope(&scope);
    let watched = locks.acquire("x", forever).await.unwrap();
    tokio::time::sleep(MS(60_000)).await;
    assert!(watched.is_held());
    drop(outer);
    assert_eq!(watched.release().await.unwrap(), Released::Unlocked);
    assert!(locks.try_lock("x").await.is_ok());
}

/// A watched hold with a cap, re-entered by another capped watched hold, keeps its
/// first cap (as on Redis): the re-entry does not move it later.
#[tokio::test(start_paused = true)]
async fn a_capped_watched_grant_keeps_its_first_cap_on_reentry() {
    let locks = MemoryLocks::new();
    let scope = LockScope::new();
    let capped = || {
        LockOptions::new()
            .lease(Lease::Watchdog)
            .max_hold(MS(5_000))
            .scope(&scope)
    };
    let first = locks.acquire("x", capped()).await.unwrap();
    let start = Instant::now();
    tokio::time::sleep(MS(3_000)).await;
    let _again = locks.acquire("x", capped()).await.unwrap();
    first.lost().await;
    assert_eq!(start.elapsed(), MS(5_000));
}

/// A lock given up is not a lost one: a `lost()` future taken while it was held and
/// kept past its release (or past letting it expire) stays pending, past its lease
/// and its cap, on a fixed lease and on the watchdog's.
#[tokio::test(start_paused = true)]
async fn a_lost_future_kept_past_the_release_stays_pending() {
    let locks = MemoryLocks::new();
    let leases = [
        ("a fixed lease", fixed(1_000)),
        ("a watched lock", LockOptions::new()),
        (
            "a capped watched lock",
            LockOptions::new().max_hold(MS(1_000)),
        ),
    ];
    for (lease, options) in leases {
        for expire in [false, true] {
            let g = locks.acquire("x", options.clone()).await.unwrap();
            let lost = g.lost();
            if expire {
                g.hold_until_expiry();
            } else {
                g.release().await.unwrap();
            }
            let resolved = tokio::time::timeout(MS(3_600_000), lost).await;
            assert!(
                resolved.is_err(),
                "{lease}, {}: lost() resolved after it was given up",
                if expire { "left to expire" } else { "released" }
            );
            // Free again for the next case.
            let next = locks.acquire("x", fixed(10).wait(MS(3_600_000)));
            next.await.unwrap().release().await.unwrap();
        }
    }
}

/// Leading is holding the election's lock, whatever lease the client gives its locks:
/// a client whose locks default to a short fixed lease still keeps its leader.
#[tokio::test(start_paused = true)]
async fn a_leader_leads_past_the_clients_fixed_lease() {
    let config = LockConfig::new().with_lease(Lease::Fixed(MS(200)));
    let locks = MemoryLocks::with_config(config).unwrap();
    let election = lock_core::Election::new(locks.clone(), "leader");
    let leadership = election.campaign(Duration::ZERO).await.unwrap();
    tokio::time::sleep(MS(1_000)).await;
    assert!(leadership.is_leading(), "the term ended with the lease");
    assert!(locks.try_lock("leader").await.unwrap_err().is_busy());
}
