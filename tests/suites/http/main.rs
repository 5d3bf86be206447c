//! lock-tower's layers on real Redis: rate limiting, idempotency keys and one-time
//! tokens, through `oneshot`, over real TCP, and their services and futures by hand.

#[path = "../common/mod.rs"]
mod common;

mod futures;
mod idempotency;
mod idempotency_over_tcp;
mod idempotency_policy;
mod rate_limit;
mod support;
