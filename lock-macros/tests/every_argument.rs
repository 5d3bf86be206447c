//! Every argument of `#[cache_lock]` together, on generic, `where`-bounded, method and
//! destructuring fns: it compiles, the futures stay `Send`, and each fn runs on the
//! in-memory store.

use std::time::Duration;

use lock_core::{LockError, MemoryLocks};
use lock_macros::cache_lock;

struct User {
    id: u64,
}

struct App {
    locks: MemoryLocks,
}

/// The app's error: the lock's, or its own (`None`).
#[derive(Debug)]
pub struct AppError(Option<LockError>);

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError(Some(e))
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
// Both bound places and a `return` on purpose: the macro keeps each as written.
#[allow(clippy::needless_return, clippy::multiple_bound_locations)]
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
    let n: u64 = "7".parse().map_err(|_| AppError(None))?;
    return Ok(voucher_id + user.id + n);
}

struct Shard {
    locks: MemoryLocks,
    id: u32,
}

impl Shard {
    #[cache_lock(prefix = "shard", key = self.id, expire = 3, client = self.locks)]
    async fn work(&self) -> Result<u32, LockError> {
        Ok(self.id)
    }
}

// Bindings from destructuring patterns count as arguments.
#[cache_lock(prefix = "pair", key = (a, b), wait = "500ms")]
async fn destructured((a, b): (u32, String)) -> std::io::Result<usize> {
    Ok(a as usize + b.len())
}

// An `impl Trait` in the return type, as axum handlers write
// `Result<impl IntoResponse, E>`: the body's type is inferred where it is opaque.
#[cache_lock(prefix = "shown", key = id, client = locks)]
async fn shown(
    locks: &MemoryLocks,
    id: u64,
) -> Result<(impl std::fmt::Display, Vec<impl Into<u64>>), LockError> {
    let parsed: u64 = "5".parse().map_err(|_| LockError::InvalidKey("5".into()))?;
    Ok((id + parsed, vec![1u8]))
}

// Inner attributes and docs in the body stay in the body.
#[cache_lock(prefix = "inner", key = id, client = locks)]
async fn with_inner_attributes(locks: &MemoryLocks, id: u64) -> Result<u64, LockError> {
    //! Counts one up.
    #![allow(clippy::needless_return)]
    return Ok(id + 1);
}

/// A crate's own alias of `Result`.
type ApiResult<T> = Result<T, AppError>;

#[cache_lock(prefix = "aliased", key = id, client = locks)]
async fn aliased(locks: &MemoryLocks, id: u64) -> ApiResult<u64> {
    Ok(id * 2)
}

// The generated futures stay `Send` (so they run on a multi-threaded runtime and in
// axum handlers): this fn only has to compile.
#[allow(dead_code)]
fn futures_are_send(app: &App, shard: &Shard) {
    fn assert_send<F: Send>(_: F) {}
    assert_send(place_order(app, 1, &User { id: 2 }, 3u8));
    assert_send(shard.work());
    assert_send(destructured((1, String::new())));
}

#[tokio::test]
async fn every_argument_together_runs() {
    let app = App {
        locks: MemoryLocks::new(),
    };
    let user = User { id: 2 };
    assert_eq!(place_order(&app, 1, &user, 3u8).await.unwrap(), 10);
    // `release = "on_expiry"` kept the lock for its 10 s, and `wait = "0s"` does not
    // wait: the same key is refused, another is not.
    let refused = place_order(&app, 1, &user, 3u8).await.unwrap_err();
    assert!(
        refused.0.as_ref().is_some_and(LockError::is_busy),
        "{refused:?}"
    );
    assert_eq!(place_order(&app, 2, &user, 3u8).await.unwrap(), 11);

    let shard = Shard {
        locks: MemoryLocks::new(),
        id: 4,
    };
    assert_eq!(shard.work().await.unwrap(), 4);
    // Released on return: the next call takes the lock again.
    assert_eq!(shard.work().await.unwrap(), 4);

    let locks = MemoryLocks::new();
    assert_eq!(with_inner_attributes(&locks, 1).await.unwrap(), 2);
    assert_eq!(aliased(&locks, 4).await.unwrap(), 8);
    let (sum, parts) = shown(&locks, 2).await.unwrap();
    assert_eq!((sum.to_string(), parts.len()), ("7".to_owned(), 1));

    lock_core::install_global(MemoryLocks::new()).unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), destructured((1, "ab".into())))
        .await
        .expect("an uncontended lock is taken at once")
        .unwrap();
    assert_eq!(n, 3);
}
