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
use lock_examples::programs::{exit_on_error, listen_addr, redis_url, serve};
use lock_tower::rate_limit::{HeaderKey, RateLimitLayer};

const USAGE: &str = "usage: rate-limited-api [--listen ADDR]   (Redis from REDIS_URL)";

#[tokio::main]
async fn main() {
    exit_on_error(
        "rate-limited-api",
        async {
            let addr = listen_addr(USAGE)?;
            let locks = LockClient::open(redis_url().as_str()).await?;
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
