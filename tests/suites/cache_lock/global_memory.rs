//! `#[cache_lock]` without `client = ...` on a process-wide store that is not Redis: the
//! in-memory store. Its own test binary, because the store is installed once per
//! process.

use lock_core::{DistributedLock, LockError, MemoryLocks};
use lock_macros::cache_lock;

#[cache_lock(prefix = "global", key = id)]
async fn job(id: u64) -> Result<u64, LockError> {
    Ok(id * 2)
}

#[tokio::test]
async fn any_store_can_be_the_process_wide_one() {
    let locks = MemoryLocks::new();
    lock_core::install_global(locks.clone()).unwrap();
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
