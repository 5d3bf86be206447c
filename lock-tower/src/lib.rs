//! tower Layers for axum and hyper built on `lock-core`.
//!
//! Not built yet. This crate will hold:
//! - `IdempotencyLayer`: keys from the `Idempotency-Key` header; duplicates in flight
//!   rejected with 409, completed ones replayed byte for byte, mismatched payloads 422;
//! - `RateLimitLayer`: GCRA rate limiting keyed by peer address, header or closure, with
//!   429 and the IETF RateLimit headers.
//!
//! Until then it exports nothing.
#![forbid(unsafe_code)]
