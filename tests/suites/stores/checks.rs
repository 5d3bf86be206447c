//! The checks every lock store passes the same way, written once against the lock
//! trait: each store's suite calls them with two clients of its own server.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_core::{DistributedLock, HeldLock, LockOptions, Released};

use crate::common::eventually;

/// `tasks` tasks, on the two clients in turn, each taking the lock `counter` 10 times:
/// never two holders at once, every token larger than the one before, every release
/// `Unlocked`.
pub async fn never_two_holders_and_tokens_grow<L>(stores: &[L; 2], tasks: usize)
where
    L: DistributedLock + Clone + 'static,
{
    let inside = Arc::new(AtomicU64::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..tasks)
        .map(|i| {
            let locks = stores[i % 2].clone();
            let (inside, last_token) = (inside.clone(), last_token.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let g = locks.lock_named("counter").await.unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    let t = g.token().unwrap().get();
                    assert!(t > last_token.swap(t, Ordering::SeqCst), "token went back");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// `a` holds `("order", 7)`: `b` is refused at once, times out after its 300 ms budget,
/// and a waiting `b` gets the lock as soon as `a` releases.
pub async fn busy_then_timeout_then_woken<L>(a: &L, b: L)
where
    L: DistributedLock + 'static,
{
    let held = a.lock_named(("order", 7_u64)).await.unwrap();
    let err = b
        .try_lock_named(("order", 7_u64))
        .await
        .map(drop)
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    let started = Instant::now();
    let err = b
        .acquire(
            ("order", 7_u64),
            LockOptions::new().wait(Duration::from_millis(300)),
        )
        .await
        .map(drop)
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    // A waiter gets it as soon as the holder releases.
    let waiter = tokio::spawn(async move { b.lock_named(("order", 7_u64)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was woken")
        .unwrap()
        .unwrap();
    assert!(got.is_held());
}

/// The store took `g`'s hold away behind its back (a killed session, a deleted node) at
/// `taken_at`: `lost()` fires within 2 s (`fired` says why it should), the guard stops
/// claiming the lock, `b` takes `name` with a larger fencing token, and releasing `g`
/// reports the loss. Returns how long after `taken_at` `lost()` fired.
pub async fn loss_lets_another_owner_in<G, L>(
    g: G,
    b: &L,
    name: &str,
    taken_at: Instant,
    fired: &str,
) -> Duration
where
    G: HeldLock,
    L: DistributedLock,
{
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect(fired);
    let after = taken_at.elapsed();
    assert!(!g.is_held());
    let next = b.try_lock_named(name).await.unwrap();
    assert!(next.token() > g.token());
    let err = g.release().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    after
}

/// `a` holds `x` while five waits of `b` on it are cut short: once `a` releases, `a`
/// takes `x` again within 5 s (none of the cancelled waits holds or later takes it).
pub async fn cancelled_waits_leave_no_lock<L>(a: &L, b: &L)
where
    L: DistributedLock,
{
    let held = a.lock_named("x").await.unwrap();
    for _ in 0..5 {
        let cut = tokio::time::timeout(Duration::from_millis(50), b.lock_named("x")).await;
        assert!(cut.is_err(), "the wait was cut");
    }
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), a.lock_named("x"))
        .await
        .expect("free after the holder's release")
        .unwrap();
    g.release().await.unwrap();
}

/// A session store applies no fixed lease and no max-hold: a grant asked for 50 ms
/// (capped at 50 ms) is still held, and `b` refused, after `past` (longer than the
/// store's watchdog lease, which a grant is first known to last); kept until the end
/// with `hold_until_expiry`, it is given back (a session lock has no lease to run
/// out), so a waiting `b` gets it.
pub async fn session_locks_ignore_leases_and_give_back_on_expiry<L>(a: &L, b: &L, past: Duration)
where
    L: DistributedLock,
{
    use lock_core::Lease;
    let short = LockOptions::new()
        .lease(Lease::Fixed(Duration::from_millis(50)))
        .max_hold(Duration::from_millis(50));
    let g = a.acquire("lease", short).await.unwrap();
    // Time passing past the lease is what is tested here.
    tokio::time::sleep(past).await;
    assert!(
        g.is_held(),
        "a session lock ended with a lease it does not have"
    );
    let err = b.try_lock_named("lease").await.map(drop).unwrap_err();
    assert!(err.is_busy(), "{err}");
    g.hold_until_expiry();
    let again = b
        .acquire("lease", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .expect("hold_until_expiry gives a session lock back");
    assert_eq!(again.release().await.unwrap(), Released::Unlocked);
}

/// A read hold of `name` is had beside the readers that hold it now, and the write hold
/// is not; the read hold is given back.
pub async fn a_reader_shares_and_the_writer_is_busy<L: DistributedLock>(locks: &L, name: &str) {
    let ours = locks
        .acquire(name, LockOptions::new().read().wait(Duration::ZERO))
        .await
        .expect("readers share");
    let err = locks
        .acquire(name, LockOptions::new().write().wait(Duration::ZERO))
        .await
        .map(drop)
        .unwrap_err();
    assert!(err.is_busy(), "{err}");
    ours.release().await.unwrap();
}

/// Neither a read hold nor the write hold of `name` is to be had now (a writer holds
/// it).
pub async fn read_and_write_busy<L: DistributedLock>(locks: &L, name: &str) {
    for options in [LockOptions::new().read(), LockOptions::new().write()] {
        let err = locks
            .acquire(name, options.wait(Duration::ZERO))
            .await
            .map(drop)
            .unwrap_err();
        assert!(err.is_busy(), "{err}");
    }
}

/// `locks` waiting up to 10 s for `name` with `options`, in a task of its own.
pub fn waiting<L, N>(
    locks: &L,
    name: N,
    options: LockOptions,
) -> tokio::task::JoinHandle<Result<L::Guard, lock_core::LockError>>
where
    L: DistributedLock + Clone + 'static,
    N: lock_core::LockName + Send + Sync + 'static,
    L::Guard: Send,
{
    let locks = locks.clone();
    tokio::spawn(async move {
        let options = options.wait(Duration::from_secs(10));
        locks.acquire(name, options).await
    })
}

/// The guard `waiter` is granted within 5 s of what should wake it (`why`).
pub async fn granted<G>(
    waiter: tokio::task::JoinHandle<Result<G, lock_core::LockError>>,
    why: &str,
) -> G {
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect(why)
        .unwrap()
        .unwrap()
}

/// `holder` takes `x`, and `waiter`'s wait of 5 s for it is granted once `holder`
/// gives it back a second later: nothing on `waiter`'s sessions (an application's
/// statement time limit) cut the wait short.
pub async fn a_wait_lasts_its_budget<L>(holder: &L, waiter: &L)
where
    L: DistributedLock,
{
    let g = holder.lock_named("x").await.unwrap();
    let started = Instant::now();
    let (taken, ()) = tokio::join!(
        waiter.acquire("x", LockOptions::new().wait(Duration::from_secs(5))),
        async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            g.release().await.unwrap();
        }
    );
    let taken = taken.expect("the wait was cut short");
    assert!(started.elapsed() >= Duration::from_millis(900));
    taken.release().await.unwrap();
}

/// A wait cut short while `holder` keeps `x` ends in the server too, within a few
/// seconds rather than at the end of its budget of a minute: its session is not left
/// queued for the lock (a server connection kept, and a turn it would take for
/// nothing). `queued` counts the sessions waiting for a lock in the server.
pub async fn a_cancelled_wait_leaves_the_servers_queue<L, Q, F>(holder: &L, waiter: L, queued: Q)
where
    L: DistributedLock + Clone + Send + Sync + 'static,
    L::Guard: Send,
    Q: Fn() -> F,
    F: std::future::Future<Output = i64>,
{
    let g = holder.lock_named("x").await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .acquire("x", LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .map(|_| ())
    });
    let five_s = Duration::from_secs(5);
    eventually(five_s, "the waiter to queue in the server", || async {
        queued().await == 1
    })
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    eventually(
        five_s,
        "the cancelled acquisition's session to leave the server's queue",
        || async { queued().await == 0 },
    )
    .await;
    assert!(g.is_held());
    g.release().await.unwrap();
}
