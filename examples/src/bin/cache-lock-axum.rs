//! An axum handler guarded by `#[cache_lock]`: one order per user at a time, across every
//! process that shares the Redis.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin cache-lock-axum
//! curl -X POST localhost:3000/users/7/orders &   # takes the lock for 2 s
//! curl -X POST localhost:3000/users/7/orders     # 409 application/problem+json
//! curl -X POST localhost:3000/users/8/orders     # another user: not blocked
//! ```

use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use lock_core::LockClient;
use lock_examples::programs::{ProgramArgs, exit_on_error, serve};
use lock_macros::cache_lock;
use lock_tower::problem::Problem;

/// How long an order's own work takes here (a payment provider, say).
const ORDER_WORK: Duration = Duration::from_secs(2);

#[derive(Clone)]
struct App {
    locks: LockClient,
}

/// A second order of the same user while this one runs is refused before the body runs:
/// 409 problem+json with `Retry-After`. The lock is released when the handler returns,
/// errs, panics or is dropped (the client went away).
#[cache_lock(prefix = "order", key = user_id, expire = "30s", client = app.locks)]
async fn place_order(State(app): State<App>, Path(user_id): Path<u64>) -> Result<String, Problem> {
    tokio::time::sleep(ORDER_WORK).await;
    Ok(format!("order placed for user {user_id}\n"))
}

const ABOUT: &str = "An axum handler guarded by #[cache_lock]: one order per user at a time.";

#[tokio::main]
async fn main() {
    exit_on_error(
        "cache-lock-axum",
        async {
            let args = ProgramArgs::parse("cache-lock-axum", ABOUT);
            let addr = args.listen;
            let app = App {
                locks: LockClient::open(args.redis.as_str()).await?,
            };
            let router = Router::new()
                .route("/users/{user_id}/orders", post(place_order))
                .with_state(app);
            serve("cache-lock-axum", addr, router).await
        }
        .await,
    );
}
