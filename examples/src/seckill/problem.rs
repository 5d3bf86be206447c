//! Error responses: `application/problem+json` (RFC 9457) with a `type` naming the case.

use axum::http::StatusCode;
use axum::http::header::{CONTENT_TYPE, HeaderValue, LOCATION, RETRY_AFTER};
use axum::response::{IntoResponse, Response};
use lock_core::LockError;

/// One problem response.
#[derive(Debug)]
pub(crate) struct Problem {
    status: StatusCode,
    kind: &'static str,
    detail: String,
    retry_after: Option<u64>,
    /// An extension member (RFC 9457 section 3.2) and a `Location`, for a refusal that
    /// points at an existing resource (409 `already-ordered`: the user's order).
    existing: Option<Box<(&'static str, String, String)>>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            detail: detail.into(),
            retry_after: None,
            existing: None,
        }
    }

    /// Names the resource the refusal is about: `member: id` in the body and
    /// `Location: location`.
    pub(crate) fn existing(mut self, member: &'static str, id: String, location: String) -> Self {
        self.existing = Some(Box::new((member, id, location)));
        self
    }

    /// Adds `Retry-After: secs` (at least 1): the refusal passes by then, so the
    /// idempotency layer does not store it and a same-key retry is answered afresh.
    pub(crate) fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.max(1));
        self
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
        Self {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service-unavailable",
                format!("{what} is unavailable right now; retry in a moment"),
            )
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let mut body = serde_json::json!({
            "type": self.kind,
            "title": self.status.canonical_reason().unwrap_or("Error"),
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        let location = self.existing.map(|existing| {
            let (member, id, location) = *existing;
            body[member] = id.into();
            location
        });
        let mut response = (self.status, body.to_string()).into_response();
        let headers = response.headers_mut();
        if let Some(value) = location.and_then(|l| HeaderValue::try_from(l).ok()) {
            headers.insert(LOCATION, value);
        }
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = self.retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// What a handler can fail with: a lock-core error (answered by lock-core's own
/// problem+json mapping: 409 `lock-busy`, 503 when Redis is down, ...) or a problem of
/// the service's own.
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
            AppError::Lock(e) => e.into_response(),
            AppError::Problem(p) => p.into_response(),
        }
    }
}
