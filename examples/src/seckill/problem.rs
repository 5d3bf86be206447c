//! Error responses: `application/problem+json` (RFC 9457) with a `type` naming the case,
//! all written by lock-tower's [`Problem`](lock_tower::problem::Problem), the one
//! writer (the layers' rejections and lock errors use it too).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lock_core::LockError;

/// One problem response of the service's own.
#[derive(Debug)]
pub(crate) struct Problem(lock_tower::problem::Problem);

impl Problem {
    pub(crate) fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self(lock_tower::problem::Problem::new(status, kind, detail))
    }

    /// Adds `Retry-After: secs` (at least 1): the refusal passes by then, so the
    /// idempotency layer does not store it and a same-key retry is answered afresh.
    pub(crate) fn retry_after(self, secs: u64) -> Self {
        Self(self.0.retry_after(secs))
    }

    /// 400 with `kind`.
    pub(crate) fn bad_request(kind: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, kind, detail)
    }

    /// 404 `not-found`.
    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", detail)
    }

    /// 503 `service-unavailable` with `Retry-After: 1`; the cause goes to the log only.
    pub(crate) fn unavailable(what: &str, cause: &dyn std::fmt::Display) -> Self {
        tracing::warn!(error = %cause, "{what} failed; answering 503");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service-unavailable",
            format!("{what} is unavailable right now; retry in a moment"),
        )
        .retry_after(1)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        self.0.into_response()
    }
}

/// What a handler can fail with: a lock-core error (answered as lock-tower renders
/// lock-core's classification: 409 `lock-busy`, 503 when Redis is down, ...) or a
/// problem of the service's own.
#[derive(Debug)]
pub(crate) enum AppError {
    Lock(LockError),
    Problem(Problem),
}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<Problem> for AppError {
    fn from(p: Problem) -> Self {
        AppError::Problem(p)
    }
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::Lock(e) => lock_tower::problem::Problem::from(e).into_response(),
            AppError::Problem(p) => p.into_response(),
        }
    }
}

