use lock_core::{LockClient, LockError};
use lock_macros::cache_lock;

struct User {
    id: u64,
}

struct App {
    locks: LockClient,
}

#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

/// Docs and attributes stay on the fn.
#[cache_lock(
    prefix = "order",
    key = (voucher_id, user.id),
    expire = "10s",
    wait = "0s",
    release = "on_expiry",
    delimiter = "-",
    hold = "write",
    client = app.locks
)]
#[allow(clippy::needless_return)]
pub async fn place_order<T: Send>(
    app: &App,
    voucher_id: u64,
    user: &User,
    extra: T,
) -> Result<u64, AppError>
where
    T: Clone,
{
    let _ = extra.clone();
    let n: u64 = "7".parse().map_err(|_| AppError)?;
    return Ok(voucher_id + user.id + n);
}

struct Shard {
    locks: LockClient,
    id: u32,
}

impl Shard {
    #[cache_lock(prefix = "shard", key = self.id, expire = 3, client = self.locks)]
    async fn work(&self) -> Result<(), LockError> {
        Ok(())
    }
}

// Bindings from destructuring patterns count as arguments.
#[cache_lock(prefix = "pair", key = (a, b), wait = "500ms")]
async fn destructured((a, b): (u32, String)) -> std::io::Result<()> {
    let _ = (a, b);
    Ok(())
}

// The generated futures stay `Send` (so they run on a multi-threaded runtime and in
// axum handlers). Only compiled: running needs a Redis.
#[allow(dead_code)]
fn futures_are_send(app: &App, shard: &Shard) {
    fn assert_send<F: Send>(_: F) {}
    assert_send(place_order(app, 1, &User { id: 2 }, 3u8));
    assert_send(shard.work());
    assert_send(destructured((1, String::new())));
}

fn main() {}
