//! A rate-limited API: `RateLimitLayer` keyed by the `X-Api-Key` header, 3 requests a
//! minute per key, shared by every process on the same Redis (GCRA on the server's
//! clock).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin rate-limited-api
//! for i in 1 2 3 4; do curl -i localhost:3000/hello -H 'X-Api-Key: k1'; done
//! # the 4th: 429 problem+json with Retry-After; every answer has RateLimit headers
//! ```

use axum::Router;
use axum::http::HeaderName;
use axum::routing::get;
use lock_core::{LockClient, RateLimit};
use lock_examples::programs::{ProgramArgs, exit_on_error, serve};
use lock_tower::rate_limit::{HeaderKey, RateLimitLayer};

const ABOUT: &str =
    "An API limited to 3 requests a minute per X-Api-Key, shared by every process on one Redis.";

#[tokio::main]
async fn main() {
    exit_on_error(
        "rate-limited-api",
        async {
            let args = ProgramArgs::parse("rate-limited-api", ABOUT);
            let addr = args.listen;
            let locks = LockClient::open(args.redis.as_str()).await?;
            let limiter = locks.rate_limiter("api", RateLimit::per_minute(3).with_burst(3));
            let router = Router::new()
                .route("/hello", get(|| async { "hello\n" }))
                // A request without the header is 400: there is no quota to count it on.
                .layer(RateLimitLayer::new(
                    limiter,
                    HeaderKey(HeaderName::from_static("x-api-key")),
                ));
            serve("rate-limited-api", addr, router).await
        }
        .await,
    );
}
