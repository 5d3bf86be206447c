//! `release = "on_expiry"`: the lock stays taken until its lease runs out however the
//! fn ends: returned, cancelled (its future dropped) or panicked.

use lock_core::{LockError, MemoryLocks};
use lock_macros::cache_lock;
use tokio::sync::oneshot;

#[cache_lock(
    prefix = "code",
    key = phone,
    expire = "60s",
    release = "on_expiry",
    wait = "0ms",
    client = locks
)]
async fn send_code(
    locks: &MemoryLocks,
    phone: u64,
    held: oneshot::Sender<()>,
    go: oneshot::Receiver<bool>,
) -> Result<(), LockError> {
    let _ = held.send(());
    if go.await.unwrap_or(false) {
        panic!("the fn panics (on purpose)");
    }
    Ok(())
}

#[tokio::test]
async fn the_window_stays_however_the_fn_ends() {
    let locks = MemoryLocks::new();
    for (phone, how) in [(1, "returned"), (2, "cancelled"), (3, "panicked")] {
        let (held, is_held) = oneshot::channel();
        let (go, going) = oneshot::channel();
        let task = {
            let locks = locks.clone();
            tokio::spawn(async move { send_code(&locks, phone, held, going).await })
        };
        is_held.await.unwrap();
        match how {
            "returned" => {
                go.send(false).unwrap();
                task.await.unwrap().unwrap();
            }
            "cancelled" => {
                task.abort();
                assert!(task.await.unwrap_err().is_cancelled());
            }
            _ => {
                go.send(true).unwrap();
                assert!(task.await.unwrap_err().is_panic());
            }
        }
        match locks.try_lock(("code", phone)).await {
            Err(e) => assert!(e.is_busy(), "{how}: {e}"),
            Ok(_) => panic!("{how}: the lock was given back before its lease ran out"),
        }
    }
}
