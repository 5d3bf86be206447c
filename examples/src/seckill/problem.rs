//! Error responses: `application/problem+json` (RFC 9457) with a `type` naming the case,
//! all written by lock-tower's [`Problem`](lock_tower::problem::Problem), the one
//! writer (the layers' rejections and lock errors use it too).

use axum::extract::Request;
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use lock_core::LockError;

/// The most of a plain-text error body kept as a problem's detail.
const MAX_DETAIL: usize = 1024;

/// One problem response of the service's own.
#[derive(Debug)]
pub(crate) struct Problem {
    problem: lock_tower::problem::Problem,
    /// A `Location` for a refusal that points at an existing resource (409
    /// `already-ordered`: the user's order).
    location: Option<String>,
}

impl Problem {
    pub(crate) fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> Self {
        Self {
            problem: lock_tower::problem::Problem::new(status, kind, detail),
            location: None,
        }
    }

    /// Names the resource the refusal is about: `member: id` in the body (an RFC 9457
    /// extension member) and `Location: location`.
    pub(crate) fn existing(self, member: &'static str, id: String, location: String) -> Self {
        Self {
            problem: self.problem.member(member, id),
            location: Some(location),
        }
    }

    /// Adds `Retry-After: secs` (at least 1): the refusal passes by then, so the
    /// idempotency layer does not store it and a same-key retry is answered afresh.
    pub(crate) fn retry_after(self, secs: u64) -> Self {
        Self {
            problem: self.problem.retry_after(secs),
            ..self
        }
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
        let mut response = self.problem.into_response();
        if let Some(value) = self.location.and_then(|l| HeaderValue::try_from(l).ok()) {
            response.headers_mut().insert(LOCATION, value);
        }
        response
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

/// Middleware over the whole router: an error answer that is not problem+json (axum's
/// empty 404 and 405, its `text/plain` rejections such as 413 for a body over the
/// limit) becomes one, with the status's reason phrase as its `type`
/// (`payload-too-large`, `method-not-allowed`, ...). Its other headers (`Allow`) stay.
/// Answers with a body of another type (the JSON health report) are left alone.
pub(crate) async fn problem_json_errors(request: Request, next: Next) -> Response {
    let route = format!("{} {}", request.method(), request.uri().path());
    let response = next.run(request).await;
    let status = response.status();
    let plain = match response.headers().get(CONTENT_TYPE) {
        None => true,
        Some(v) => v.as_bytes().starts_with(b"text/plain"),
    };
    if !(status.is_client_error() || status.is_server_error()) || !plain {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = match axum::body::to_bytes(body, MAX_DETAIL).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let detail = match status {
        StatusCode::NOT_FOUND if text.is_empty() => format!("there is no {route}"),
        StatusCode::METHOD_NOT_ALLOWED if text.is_empty() => {
            format!("{route} is not allowed; the Allow header lists the methods")
        }
        _ if text.is_empty() => format!("{route}: {status}"),
        _ => text,
    };
    let kind = status_kind(status);
    let problem = lock_tower::problem::Problem::new(status, kind, detail);
    let written: Response = problem.into_response();
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    parts.headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    Response::from_parts(parts, written.into_body())
}

/// A problem `type` from a status: its reason phrase in kebab case (`not-found`).
fn status_kind(status: StatusCode) -> String {
    let reason = status.canonical_reason().unwrap_or("error");
    reason
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use axum::Router;
    use axum::body::{Body, Bytes};
    use axum::http::Request;
    use axum::routing::post;
    use tower::ServiceExt;

    use super::*;

    fn router() -> Router {
        Router::new()
            .route("/echo", post(|body: Bytes| async move { body }))
            .route(
                "/json-error",
                post(|| async {
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        axum::Json(serde_json::json!({"status": "down"})),
                    )
                }),
            )
            .layer(axum::middleware::from_fn(problem_json_errors))
    }

    async fn send(method: &str, uri: &str, body: Vec<u8>) -> (Response, String) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::from(body))
            .unwrap();
        let response = router().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        (Response::from_parts(parts, Body::empty()), text)
    }

    fn assert_problem(response: &Response, body: &str, status: u16, kind: &str) {
        assert_eq!(response.status(), status, "{body}");
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "application/problem+json",
            "{body}"
        );
        let json: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(json["type"], kind, "{body}");
        assert_eq!(json["status"], status, "{body}");
        assert!(!json["detail"].as_str().unwrap().is_empty(), "{body}");
    }

    #[tokio::test]
    async fn axum_errors_become_problems() {
        let (r, body) = send("POST", "/echo", vec![b'x'; 3 << 20]).await;
        assert_problem(&r, &body, 413, "payload-too-large");
        let (r, body) = send("GET", "/nope", Vec::new()).await;
        assert_problem(&r, &body, 404, "not-found");
        assert!(body.contains("GET /nope"), "{body}");
        let (r, body) = send("DELETE", "/echo", Vec::new()).await;
        assert_problem(&r, &body, 405, "method-not-allowed");
        assert_eq!(r.headers()["allow"], "POST");
        // What is not an error, or already has a body of its own, passes untouched.
        let (r, body) = send("POST", "/echo", b"hi".to_vec()).await;
        assert_eq!((r.status(), body.as_str()), (StatusCode::OK, "hi"));
        let (r, body) = send("POST", "/json-error", Vec::new()).await;
        assert_eq!(r.status(), 503);
        assert_eq!(body, r#"{"status":"down"}"#);
    }
}
