//! tower Layers for axum and hyper built on `lock-core`.
//!
//! - [`idempotency`]: `IdempotencyLayer`, keys from the `Idempotency-Key` header;
//!   duplicates in flight rejected with 409 (or waited for), completed ones replayed
//!   byte for byte, mismatched payloads 422.
//! - [`one_time_token`]: `OneTimeTokenLayer`, the server-issued token that exactly one
//!   submission may use.
//! - [`rate_limit`]: GCRA rate limiting keyed by peer address, header, trusted-proxy
//!   chain or closure; 429 problem+json with `Retry-After` and the IETF RateLimit
//!   headers.
//!
//! - [`KeyExtractor`]: the key of a request, one trait for both keyed layers (closures,
//!   the peer address, a header, ...).
//! - [`problem`]: [`Problem`](problem::Problem), the one `application/problem+json`
//!   writer: every rejection of the layers, and [`lock_core::LockError`]s as responses
//!   (`From<LockError>`), e.g. as the error type of a `#[cache_lock]` axum handler.
//!
//! Features: `axum` reads the peer address from axum's `ConnectInfo`, and makes
//! `Problem` an axum `IntoResponse`.
//!
//! Several layers on one route: stack them in one `tower::ServiceBuilder` and apply it
//! with one `.layer` call. axum boxes the service of every `.layer` call and clones
//! the boxes once per request, so one stack costs one box instead of one per layer:
//!
//! ```no_run
//! use axum::{Router, routing::post};
//! use lock_core::{LockClient, RateLimit};
//! use lock_tower::idempotency::IdempotencyLayer;
//! use lock_tower::rate_limit::{PeerIp, RateLimitLayer};
//!
//! # async fn app() -> Result<(), lock_core::LockError> {
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//! let protections = tower::ServiceBuilder::new()
//!     // Outermost first: a request over its rate is refused before it claims a key.
//!     .layer(RateLimitLayer::new(
//!         client.rate_limiter("pay", RateLimit::per_second(5)),
//!         PeerIp::new(),
//!     ))
//!     .layer(IdempotencyLayer::new(client.idempotency_store("pay")));
//! let app: Router = Router::new().route("/pay", post(|| async { "paid" }).layer(protections));
//! # let _ = app; Ok(()) }
//! ```

// Lints: `[workspace.lints]` in the workspace Cargo.toml.

// The README's examples compile as doctests, so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod body;
mod check;
mod hash;
pub mod idempotency;
mod key;
pub mod one_time_token;
pub mod problem;
pub mod rate_limit;

pub use body::ResponseBody;
pub use key::KeyExtractor;
