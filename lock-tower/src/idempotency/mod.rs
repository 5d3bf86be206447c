//! Idempotent POSTs for tower services: keys from the `Idempotency-Key` header, on Redis
//! (the IETF draft-ietf-httpapi-idempotency-key-header, with Stripe's semantics).
//!
//! A payment retried after a network error must not charge twice: the client sends the
//! same key with the retry, and the layer answers it with the first response instead of
//! running the handler again.
//!
//! Behavior:
//! - **Protected requests**: POST and PATCH ([`IdempotencyLayer::methods`]); others pass
//!   through untouched. A protected request without a key passes through unprotected, or
//!   gets 400 with [`IdempotencyLayer::require_key`].
//! - **Keys**: from [`HeaderKey`] (`Idempotency-Key`, an RFC 8941 sf-string as the draft
//!   says, or leniently a bare key such as an unquoted UUID, the same key as its quoted
//!   form) or any [`KeyExtractor`]; 1 to [`MAX_KEY_LEN`] printable ASCII characters.
//!   Malformed (a bare key with spaces or other characters a token cannot hold,
//!   parameters, the header twice): 400.
//! - **Scope**: the stored key is method + path + [`Principal`] (default: a hash of
//!   `Authorization`) + the client's key, so one client never sees another's response;
//!   parts too long to store once escaped (a long principal, a key of many `:`) are
//!   stored under the SHA-256 of them all. A keyed request without a principal gets 400, unless
//!   [`IdempotencyLayer::allow_anonymous`] lets anonymous clients share one scope
//!   (then only the secrecy of the keys separates them).
//! - **Fingerprint**: SHA-256 of method, path and query, content type and body. The body
//!   is buffered up to [`IdempotencyLayer::max_body_bytes`] (1 MiB); over it, 413.
//! - **First request** claims the key atomically with an in-flight lease, renewed while
//!   the handler runs and its response is read ([`lock_core::Claim::keep_alive`], polled
//!   by the response future: the one renewal mechanism), so a crashed server frees the
//!   key one lease later. Its response (status, headers minus hop-by-hop ones and
//!   [`IdempotencyLayer::deny_headers`], default `Set-Cookie`, body) is stored for
//!   [`IdempotencyLayer::retention`] (24 h) before it is returned.
//! - **Duplicates**: in flight, 409 with `Retry-After: 1` (or wait and replay, with
//!   [`IdempotencyLayer::wait_in_flight`]); completed, the stored status, headers and body
//!   byte for byte, plus `Idempotent-Replayed: true`; same key with another
//!   fingerprint, 422.
//! - **Not stored, key freed** (a retry runs again): refusals that ask for a retry
//!   (any 4xx or 5xx with `Retry-After`, and by default 408, 425 and 429: which statuses are
//!   stored is [`IdempotencyLayer::store_status`]); 5xx responses (unless
//!   [`IdempotencyLayer::store_server_errors`]); a handler that panics or a service error;
//!   responses larger than
//!   [`IdempotencyLayer::max_stored_bytes`] (1 MiB), which still go to the client: a body
//!   whose size is known to be larger is streamed through untouched; of one of unknown
//!   size at most the limit (plus one frame) is read, then the key is freed and what was
//!   read goes out followed by the rest, streamed (memory stays bounded; a warning is
//!   logged). A response's trailers (gRPC's `grpc-status`, say) go out and are stored
//!   and replayed with its body, minus the denied fields; a request's trailers are
//!   dropped when its body is buffered.
//! - **A client that goes away** does not cut a claimed request short: its handler and
//!   the storing of the response run in a task of their own (so the inner service's
//!   future and error must be `Send + 'static`, as axum's are), and the retry is
//!   replayed. A handler cut at an await could have done part of its work, which a
//!   second run would do again. Left alone, it may run for
//!   [`IdempotencyLayer::detached_limit`] (60 s); past that it is stopped and the key
//!   freed. A graceful shutdown waits for open connections, not for these tasks: one
//!   still running when the runtime ends is stopped, and its key freed.
//! - **Redis unavailable**: 503 (fail closed, the default) or, with
//!   [`IdempotencyLayer::fail_closed`]`(false)`, the request runs unprotected and a
//!   warning is logged. Protection resumes by itself when Redis is back. If Redis goes
//!   away while the handler runs, its response still goes out unstored (logged), and
//!   the key frees itself one lease later at the latest.
//! - **Responses, never errors**: every rejection is `application/problem+json`; an
//!   infallible service stays infallible, so it works under `axum::Router::layer`, and the
//!   service is `Clone`. [`IdempotencyService::get_ref`],
//!   [`get_mut`](IdempotencyService::get_mut) and
//!   [`into_inner`](IdempotencyService::into_inner) reach the inner service. The
//!   [`ResponseFuture`] panics if polled after completion.
//!
//! # Bodies
//!
//! A protected request's body is buffered, so the handler gets a new body of the same
//! type built with `From<Bytes>`: requests are `Request<B>` with `B: http_body::Body +
//! From<Bytes>` in and out (unprotected requests keep their streaming body). Responses
//! are `Response<`[`ResponseBody`](crate::ResponseBody)`<R>>` for an inner
//! `Response<R>` with `R: Body<Data = Bytes>`: the inner body, or one the layer wrote
//! (a replay, a problem), so `R` needs no `From` impls. axum's `Body` fits both sides.
//! With plain hyper, whose requests carry `hyper::body::Incoming`, wrap the body first,
//! e.g. with `axum_core::body::Body::new` in a `map_request` layer; answer with
//! `http_body_util::Full<Bytes>`, axum's `Body` or any `Bytes` body.
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Router, routing::post};
//! use lock_core::LockClient;
//! use lock_tower::idempotency::IdempotencyLayer;
//!
//! # async fn app() -> Result<(), Box<dyn std::error::Error>> {
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged" }))
//!     .layer(
//!         IdempotencyLayer::new(client.idempotency_store("payments"))
//!             .require_key(true)
//!             .retention(Duration::from_secs(24 * 3600))?,
//!     );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

// The files depend one way: `layer` builds the `service`, which makes the `future`,
// which drives the `phases` (before and after the handler). All of them read
// `settings`, which imports nothing here; `key`, `scope` and `record` import none of
// the others.
mod future;
mod key;
mod layer;
mod phases;
mod record;
mod scope;
mod service;
mod settings;

pub use crate::KeyExtractor;
pub use future::ResponseFuture;
pub use key::{HeaderKey, MAX_KEY_LEN};
pub use layer::IdempotencyLayer;
pub use scope::{AuthorizationHash, Principal};
pub use service::IdempotencyService;
pub use settings::stored_by_default;
