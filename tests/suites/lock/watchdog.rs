//! Watchdog renewal (also of locks taken while a renewal pass runs), wake-up of
//! waiters, and the lost signal with fencing.

use crate::common;

use std::time::{Duration, Instant};

use common::{assert_really_held, client};
use lock_core::{Backoff, LockConfig, LockOptions, Released};
use lock_tests::RedisServer;

/// Lease 1 s, the holder works 4 s: the watchdog keeps it, nobody else gets in; after
/// release a waiter on another client gets the lock within 50 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_keeps_a_long_hold_and_release_wakes_the_waiter() {
    let server = RedisServer::start();
    let lease = LockConfig::new().with_watchdog_lease(Duration::from_secs(1));
    let holder = client(&server, lease.clone()).await;
    // A slow fallback backoff: only the release message can wake it quickly.
    let slow = Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(1),
    };
    let other = client(&server, lease.with_backoff(slow)).await;

    let guard = holder
        .acquire("report", LockOptions::new().wait(Duration::ZERO).fenced())
        .await
        .unwrap();
    let intruder = {
        let other = other.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().wait(Duration::from_secs(10)).fenced();
            let g = other.acquire("report", opts).await.unwrap();
            (Instant::now(), g)
        })
    };
    // The holder "works" for 4 s; meanwhile try_lock keeps failing.
    let work_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < work_until {
        let e = other.try_lock("report").await.unwrap_err();
        assert!(e.is_busy(), "{e}");
        assert!(guard.is_held());
        assert!(
            !intruder.is_finished(),
            "waiter got in while the holder worked"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (granted_at, g2) = tokio::time::timeout(Duration::from_secs(2), intruder)
        .await
        .expect("waiter woke")
        .unwrap();
    let handoff = granted_at.duration_since(released_at);
    assert!(
        handoff < Duration::from_millis(50),
        "handoff took {handoff:?}"
    );
    assert_eq!(
        g2.fencing_token().map(|t| t.get()),
        Some(2),
        "second fresh grant of the lock"
    );
    g2.release().await.unwrap();
}

/// The cap on total hold time: the watchdog stops renewing, the lease runs out, and the
/// holder is told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_caps_the_watchdog() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let c = client(&server, config).await;
    let started = Instant::now();
    let g = c
        .acquire(
            "capped",
            LockOptions::new().max_hold(Duration::from_millis(600)),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost() once the cap stops the renewals");
    let held_for = started.elapsed();
    // Renewed past one lease, stopped at the cap, expired within a lease after it.
    assert!(
        held_for > Duration::from_millis(600),
        "lost after {held_for:?}"
    );
    assert!(
        held_for < Duration::from_millis(600 + 300 + 500),
        "lost after {held_for:?}"
    );
    // Our local deadline was measured from before the renewal, so Redis expires it a
    // moment later.
    let key = c.keys("capped").unwrap().key;
    common::eventually(Duration::from_secs(1), "the key to expire", || async {
        !common::exists(&server, &key).await
    })
    .await;
    assert!(g.release().await.unwrap_err().is_expired());
}

/// A hold re-entered after the cap stopped the renewals (the lease not yet run out)
/// does not start them again: the grant still ends one lease after its last renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentry_after_the_cap_does_not_restart_the_renewals() {
    let server = RedisServer::start();
    // Renewals every 400 ms; the one due at 1.2 s finds the 1 s cap passed.
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(1_200));
    let c = client(&server, config).await;
    let g = c
        .acquire(
            "capped-again",
            LockOptions::new().max_hold(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(g.is_held(), "the last renewal's lease runs to about 2 s");
    let again = g.reenter().await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), g.lost())
        .await
        .expect("lost() one lease after the last renewal, re-entered or not");
    assert!(!again.is_held());
}

/// Many locks taken while the watchdog is busy renewing others are all renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_scheduled_during_a_renewal_pass_are_renewed() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(200));
    let a = client(&server, config).await;
    let b = client(&server, LockConfig::new()).await;
    let mut guards = Vec::new();
    let started = Instant::now();
    // Acquisitions spread over several renewal periods.
    while started.elapsed() < Duration::from_millis(400) {
        guards.push(a.try_lock(format!("many{}", guards.len())).await.unwrap());
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    for g in &guards {
        assert_really_held(&server, &b, g).await;
    }
    for g in guards {
        assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    }
}

/// Short holds released in random order behind long ones leave entries in the
/// watchdog's queue that its front cannot drop until the long ones are renewed: the
/// queue stays bounded by what is held all the same, the stale entries go as they come
/// due, and the long holds are renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_renewal_queue_stays_bounded_by_what_is_held() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_secs(10));
    let period = config.watchdog_period();
    let a = client(&server, config).await;
    let b = client(&server, LockConfig::new()).await;
    let mut long = Vec::new();
    for i in 0..3 {
        long.push(a.try_lock(format!("long{i}")).await.unwrap());
    }
    let mut rng = fastrand::Rng::with_seed(7);
    let mut short = Vec::new();
    let mut most = 0;
    for i in 0..3_000 {
        short.push(a.try_lock(("short", i)).await.unwrap());
        if short.len() > 40 || rng.bool() {
            let g = short.swap_remove(rng.usize(..short.len()));
            assert_eq!(g.release().await.unwrap(), Released::Unlocked);
        }
        most = most.max(a.watchdog_entries());
    }
    // At most 44 held: twice that, or the floor of 1024.
    assert!(most <= 1024, "{most} entries queued for at most 44 locks");
    assert!(
        most > 900,
        "{most} entries: the test no longer leaves stale ones"
    );
    for g in short {
        g.release().await.unwrap();
    }
    // Every short hold's entry comes due within a period; the long ones renew.
    tokio::time::sleep(period + period / 2).await;
    for g in &long {
        assert_really_held(&server, &b, g).await;
    }
    // Each lock held: its entry, and one per renewal within the last lease (due when
    // the lease that renewal was sent under would have ended).
    assert!(
        a.watchdog_entries() <= long.len() * 4,
        "{} entries left for {} locks held",
        a.watchdog_entries(),
        long.len()
    );
    for g in long {
        assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    }
}

/// A held lock whose key another program overwrote with another type is lost, and
/// only it: the locks renewed in the same pass (a plain one and a read hold) go on
/// being renewed, whichever script's entry failed (a read hold's hash made a string,
/// a plain lock's string made a hash).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_key_holds_another_type_is_lost_alone() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(600);
    let a = client(&server, LockConfig::new().with_watchdog_lease(lease)).await;
    let b = client(&server, LockConfig::new()).await;
    let now = LockOptions::new().wait(Duration::ZERO);
    let plain = a.acquire("kept-plain", now.clone()).await.unwrap();
    let reader = a.acquire("kept-shared", now.clone().read()).await.unwrap();
    let shared_gone = a
        .acquire("overwritten-shared", now.clone().read())
        .await
        .unwrap();
    let plain_gone = a.acquire("overwritten-plain", now).await.unwrap();
    // Another program writes over two of them: a string where a read hold's hash
    // was, a hash where a plain lock's string was.
    redis::pipe()
        .cmd("SET")
        .arg(&shared_gone.keys().key)
        .arg("not a hash")
        .cmd("DEL")
        .arg(&plain_gone.keys().key)
        .cmd("HSET")
        .arg(&plain_gone.keys().key)
        .arg("field")
        .arg("not a string")
        .exec_async(&mut server.connection().await)
        .await
        .unwrap();

    for (name, gone) in [("shared", &shared_gone), ("plain", &plain_gone)] {
        tokio::time::timeout(lease * 2, gone.lost())
            .await
            .unwrap_or_else(|_| panic!("the overwritten {name} lock was not reported lost"));
    }
    // Three leases on, the others are still held: renewed pass after pass.
    tokio::time::sleep(lease * 3).await;
    assert!(
        reader.is_held(),
        "the read hold renewed beside them was lost"
    );
    let e = b
        .acquire(
            "kept-shared",
            LockOptions::new().write().wait(Duration::ZERO),
        )
        .await
        .unwrap_err();
    assert!(e.is_busy(), "a writer got past the read hold: {e}");
    assert_really_held(&server, &b, &plain).await;
    assert_eq!(plain.release().await.unwrap(), Released::Unlocked);
    assert_eq!(reader.release().await.unwrap(), Released::Unlocked);
}
