#![allow(unused)]
use lock_core::LockError;
use lock_macros::cache_lock;

struct Point {
    x: i32,
}

#[cache_lock(prefix = "p", key = point)]
async fn f(point: Point) -> Result<(), LockError> {
    let _ = point.x;
    Ok(())
}

fn main() {}
