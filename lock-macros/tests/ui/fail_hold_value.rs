#![allow(unused)]
use lock_core::LockError;
use lock_macros::cache_lock;

#[cache_lock(prefix = "p", key = id, hold = "shared")]
async fn f(id: u64) -> Result<(), LockError> {
    Ok(())
}

fn main() {}
