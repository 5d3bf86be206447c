//! Rate limiting for tower services: GCRA per client key, on Redis.
//!
//! Behavior:
//! - Each request is keyed by a [`KeyExtractor`] (the trait the idempotency layer reads
//!   its keys with too): the peer IP ([`PeerIp`]; IPv6 by its /64,
//!   [`PeerIp::ipv6_prefix`]), a header ([`HeaderKey`]), the client behind trusted
//!   proxies ([`ForwardedFor`], never the `X-Forwarded-For` header blindly), or a
//!   closure. No key (or an empty one): 400 problem+json; a key the extractor refuses:
//!   400 with its reason. A key longer than [`MAX_LITERAL_KEY_LEN`] bytes is counted
//!   under its SHA-256: no input can switch the limit off.
//! - Over the limit: 429 `application/problem+json` with `Retry-After`. Every decided
//!   request carries the IETF `RateLimit-Policy` and `RateLimit` headers, one item each
//!   named by [`RateLimitLayer::policy_name`]: stacked layers each append their own.
//! - Redis unavailable: the request passes and a warning is logged (fail open), or,
//!   with [`RateLimitLayer::fail_closed`], 503. Only that: a quota Redis is never asked
//!   about (an invalid [`lock_core::RateLimit`] or limiter name) answers 500.
//! - Rejections are responses, never service errors: an infallible service stays
//!   infallible, so it works under `axum::Router::layer` and plain hyper. Responses are
//!   `Response<`[`ResponseBody`](crate::ResponseBody)`<R>>` for an inner `Response<R>`
//!   (the inner body, or the problem the layer wrote), so `R` needs no `From` impls.
//! - [`RateLimitService::get_ref`], [`get_mut`](RateLimitService::get_mut) and
//!   [`into_inner`](RateLimitService::into_inner) reach the inner service. The
//!   [`ResponseFuture`] panics if polled after completion.
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! use lock_core::{LockClient, RateLimit};
//! use lock_tower::rate_limit::{HeaderKey, RateLimitLayer};
//!
//! # async fn app() -> Result<(), lock_core::LockError> {
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//! let limiter = client.rate_limiter("per-user", RateLimit::per_second(5).with_burst(10));
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(
//!         limiter,
//!         HeaderKey(http::HeaderName::from_static("x-user-id")),
//!     ));
//! # let _ = app; Ok(()) }
//! ```

mod key;
mod layer;
mod service;
mod verdict;

pub use crate::KeyExtractor;
pub use crate::check::ResponseFuture;
pub use key::{DEFAULT_IPV6_PREFIX, ForwardedFor, HeaderKey, IpNet, MAX_LITERAL_KEY_LEN, PeerIp};
pub use layer::RateLimitLayer;
pub use service::RateLimitService;
