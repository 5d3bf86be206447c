//! `#[cache_lock]` without `client = ...` on a process-wide store that is not Redis: the
//! in-memory store. Its own test binary, because the store is installed once per
//! process.

use lock_core::{DistributedLock, LockError, MemoryLocks};
use lock_macros::cache_lock;

#[cache_lock(prefix = "global", key = id)]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id * 2)
}

/// The process-wide store, installed by the first test that asks.
fn installed() -> &'static MemoryLocks {
    static STORE: std::sync::OnceLock<MemoryLocks> = std::sync::OnceLock::new();
    STORE.get_or_init(|| {
        let locks = MemoryLocks::new();
        lock_core::install_global(locks.clone()).unwrap();
        locks
    })
}

#[tokio::test]
async fn any_store_can_be_the_process_wide_one() {
    let locks = installed();
    assert!(
        lock_core::install_global(MemoryLocks::new()).is_err(),
        "installed twice"
    );
    assert_eq!(job(21).await.unwrap(), 42);
    let guard = locks.try_lock_named(("global", 5_u64)).await.unwrap();
    assert!(
        job(5).await.unwrap_err().is_busy(),
        "the macro used another store"
    );
    drop(guard);
    assert_eq!(job(5).await.unwrap(), 10);
}

#[cache_lock(prefix = "shelf", key = id, hold = "read")]
async fn read_shelf(id: u64, done: tokio::sync::oneshot::Receiver<()>) -> Result<(), LockError> {
    let _ = done.await;
    Ok(())
}

#[cache_lock(prefix = "shelf", key = id, hold = "write")]
async fn restock(id: u64) -> Result<(), LockError> {
    Ok(())
}

/// `hold = "read"` bodies run side by side; a `hold = "write"` body waits for none and
/// is refused while any reader runs.
#[tokio::test]
async fn read_holds_share_and_the_write_hold_is_alone() {
    installed();
    let (stop_a, a) = tokio::sync::oneshot::channel();
    let (stop_b, b) = tokio::sync::oneshot::channel();
    let first = tokio::spawn(read_shelf(3, a));
    let second = tokio::spawn(read_shelf(3, b));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    // Both readers in: the writer is refused (busy) until they leave.
    loop {
        match restock(3).await {
            Err(e) if e.is_busy() => break,
            other => {
                other.unwrap();
                assert!(
                    std::time::Instant::now() < deadline,
                    "the readers never got in"
                );
                tokio::task::yield_now().await;
            }
        }
    }
    assert!(
        !first.is_finished() && !second.is_finished(),
        "readers run together"
    );
    stop_a.send(()).unwrap();
    stop_b.send(()).unwrap();
    first.await.unwrap().unwrap();
    second.await.unwrap().unwrap();
    restock(3).await.expect("free once the readers left");
}

#[cache_lock(prefix = "counter", key = id, hold = "fair", wait = "30s")]
async fn serve(
    id: u64,
    who: usize,
    served: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
) -> Result<(), LockError> {
    served.lock().unwrap().push(who);
    Ok(())
}

/// `hold = "fair"` bodies run in the order their callers started waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_holds_run_in_arrival_order() {
    let locks = installed();
    let held = locks.try_lock_named(("counter", 1_u64)).await.unwrap();
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut callers = Vec::new();
    for who in 0..4 {
        callers.push(tokio::spawn(serve(1, who, served.clone())));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while locks.in_line(("counter", 1_u64)).unwrap() < who + 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "caller {who} never queued"
            );
            tokio::task::yield_now().await;
        }
    }
    held.release().await.unwrap();
    for c in callers {
        c.await.unwrap().unwrap();
    }
    assert_eq!(*served.lock().unwrap(), vec![0, 1, 2, 3]);
}
