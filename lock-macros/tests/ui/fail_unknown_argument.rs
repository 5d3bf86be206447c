#![allow(unused)]
use lock_core::LockError;
use lock_macros::cache_lock;

#[cache_lock(prefix = "p", key = id, timeout = "1s")]
async fn f(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
