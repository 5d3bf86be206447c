//! Server-issued one-time tokens: a submission must carry a token the server issued, and
//! each token is accepted once.
//!
//! The server issues a token with [`lock_core::OneTimeTokens::issue`] (e.g. with the
//! order form), the client sends it back in the `One-Time-Token` header, and this layer
//! consumes it before the handler runs. A resubmission (double click, refresh, retry of
//! a request that did go through) carries a used token and is refused.
//!
//! Behavior:
//! - Protected methods: POST and PATCH ([`OneTimeTokenLayer::methods`]); others pass
//!   through untouched.
//! - No token: 400 problem+json. A token that is unknown, expired, issued for another
//!   scope or already used: 409 problem+json. Of concurrent requests with one token,
//!   exactly one reaches the handler.
//! - Redis unavailable: 503 (fail closed, the default) or, with
//!   [`OneTimeTokenLayer::fail_closed`]`(false)`, the request runs and a warning is
//!   logged.
//! - Rejections are responses, never service errors (works under `axum::Router::layer`
//!   and plain hyper). Responses are `Response<`[`ResponseBody`](crate::ResponseBody)`<R>>`
//!   for an inner `Response<R>` (the inner body, or the problem the layer wrote), so `R`
//!   needs no `From` impls.
//! - [`OneTimeTokenService::get_ref`], [`get_mut`](OneTimeTokenService::get_mut) and
//!   [`into_inner`](OneTimeTokenService::into_inner) reach the inner service. The
//!   [`ResponseFuture`] panics if polled after completion.
//!
//! ```no_run
//! use std::time::Duration;
//! use axum::{Router, routing::{get, post}};
//! use lock_core::LockClient;
//! use lock_tower::one_time_token::OneTimeTokenLayer;
//!
//! # async fn app() -> Result<(), lock_core::LockError> {
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//! let tokens = client.one_time_tokens("forms");
//! let issuer = tokens.clone();
//! let app: Router = Router::new()
//!     // GET is not protected: it hands out a token for the checkout form.
//!     .route("/checkout", get(move || async move {
//!         issuer.issue("checkout", Duration::from_secs(600)).await.unwrap_or_default()
//!     }))
//!     .route("/checkout", post(|| async { "ordered" }))
//!     .layer(OneTimeTokenLayer::new(tokens, "checkout"));
//! # let _ = app; Ok(()) }
//! ```

mod layer;
mod service;

pub use crate::check::ResponseFuture;
pub use layer::OneTimeTokenLayer;
pub use service::OneTimeTokenService;
