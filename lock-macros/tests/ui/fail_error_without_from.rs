#![allow(unused)]
use lock_core::LockError;
use lock_macros::cache_lock;

#[derive(Debug)]
struct MyError;

#[cache_lock(prefix = "p", key = id)]
async fn f(id: u64) -> Result<(), MyError> {
    Ok(())
}

fn main() {}
