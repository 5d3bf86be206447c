#![allow(unused)]
use lock_core::LockError;
use lock_macros::cache_lock;

#[cache_lock(prefix = "p", key = id, wait = "1s", wait = "2s")]
async fn f(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
