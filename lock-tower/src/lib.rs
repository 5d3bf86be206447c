//! tower Layers for axum and hyper built on `lock-core`.
//!
//! - [`rate_limit`]: GCRA rate limiting keyed by peer address, header, trusted-proxy
//!   chain or closure; 429 problem+json with `Retry-After` and the IETF RateLimit
//!   headers.
//!
//! Still to come: `IdempotencyLayer` (keys from the `Idempotency-Key` header;
//! duplicates in flight rejected with 409, completed ones replayed, mismatched payloads
//! 422).
//!
//! Features: `axum` reads the peer address from axum's `ConnectInfo`.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, missing_debug_implementations)]

mod problem;
pub mod rate_limit;
