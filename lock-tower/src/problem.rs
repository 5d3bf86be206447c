//! `application/problem+json` responses (RFC 9457): the one problem writer of the
//! workspace. The layers reject with it, [`Problem::from`] a [`LockError`] renders
//! lock-core's classification of it, and services can answer their own problems with it.
//!
//! ```
//! use http::StatusCode;
//! use lock_tower::problem::Problem;
//!
//! let p = Problem::new(StatusCode::FORBIDDEN, "not-active", "the sale starts at noon")
//!     .retry_after(90);
//! let r: http::Response<bytes::Bytes> = p.into_http_response();
//! assert_eq!(r.status(), 403);
//! assert_eq!(r.headers()["content-type"], "application/problem+json");
//! assert_eq!(r.headers()["retry-after"], "90");
//! assert_eq!(
//!     r.body(),
//!     r#"{"type":"not-active","title":"Forbidden","status":403,"detail":"the sale starts at noon"}"#
//! );
//! ```
//!
//! With axum (this crate's `axum` feature), `Problem` is an `IntoResponse`, and
//! `From<LockError>` makes it the error type of a `#[cache_lock]` handler:
//!
//! ```
//! use axum::extract::{Path, State};
//! use lock_core::LockClient;
//! use lock_macros::cache_lock;
//! use lock_tower::problem::Problem;
//!
//! // A concurrent duplicate: 409 `lock-busy` with Retry-After; Redis down: 503.
//! #[cache_lock(prefix = "order", key = user_id, client = locks)]
//! async fn create_order(
//!     State(locks): State<LockClient>,
//!     Path(user_id): Path<u64>,
//! ) -> Result<String, Problem> {
//!     Ok(format!("order for {user_id}"))
//! }
//! ```

use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};
use lock_core::{ErrorClass, LockError};

/// One problem: `type`, `title` (the status's reason phrase), `status`, `detail`,
/// string extension members (RFC 9457 section 3.2), and an optional `Retry-After`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    status: StatusCode,
    kind: Cow<'static, str>,
    detail: String,
    members: Vec<(&'static str, String)>,
    retry_after: Option<u64>,
}

impl Problem {
    /// A problem with `status`, `type` `kind` (a short kebab-case name) and `detail`
    /// (for the client: no internals).
    pub fn new(
        status: StatusCode,
        kind: impl Into<Cow<'static, str>>,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind: kind.into(),
            detail: detail.into(),
            members: Vec::new(),
            retry_after: None,
        }
    }

    /// Adds the extension member `name: value` (a string), written after `detail`; a
    /// name of the standard members (`type`, `title`, `status`, `detail`, `instance`)
    /// is ignored rather than written twice.
    ///
    /// ```
    /// use http::StatusCode;
    /// use lock_tower::problem::Problem;
    ///
    /// let p = Problem::new(StatusCode::CONFLICT, "already-ordered", "one per user")
    ///     .member("order_id", "42");
    /// assert!(p.to_json().ends_with(r#""detail":"one per user","order_id":"42"}"#));
    /// ```
    pub fn member(mut self, name: &'static str, value: impl Into<String>) -> Self {
        if !matches!(name, "type" | "title" | "status" | "detail" | "instance") {
            self.members.push((name, value.into()));
        }
        self
    }

    /// Adds `Retry-After: secs` (at least 1).
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs.max(1));
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The problem `type`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The body: `{"type", "title", "status", "detail", members...}`, in that order.
    pub fn to_json(&self) -> String {
        let title = self.status.canonical_reason().unwrap_or("Error");
        // Room for the usual body; members or escapes past it grow the string.
        let mut out = String::with_capacity(96 + self.kind.len() + self.detail.len());
        out.push_str("{\"type\":");
        json_string(&mut out, &self.kind);
        out.push_str(",\"title\":");
        json_string(&mut out, title);
        out.push_str(",\"status\":");
        out.push_str(self.status.as_str());
        out.push_str(",\"detail\":");
        json_string(&mut out, &self.detail);
        for (name, value) in &self.members {
            out.push(',');
            json_string(&mut out, name);
            out.push(':');
            json_string(&mut out, value);
        }
        out.push('}');
        out
    }

    /// The response: status, `Content-Type: application/problem+json`, `Retry-After`
    /// if set, and [`to_json`](Self::to_json) as the body (any body type built from
    /// `Bytes`: axum's `Body`, `Full<Bytes>`, [`ResponseBody`](crate::ResponseBody)).
    pub fn into_http_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(Bytes::from(self.to_json())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
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

impl From<&LockError> for Problem {
    /// lock-core's classification ([`LockError::class`]) as a problem: busy or lost 409,
    /// invalid input 400, unavailable 503, misconfigured 500; the `type` is
    /// [`LockError::code`], `Retry-After` is [`LockError::retry_after`] rounded up. A
    /// server error's detail is generic (the error itself is logged, not sent).
    fn from(e: &LockError) -> Self {
        let class = e.class();
        let status = match class {
            ErrorClass::Busy | ErrorClass::Lost => StatusCode::CONFLICT,
            ErrorClass::InvalidInput => StatusCode::BAD_REQUEST,
            ErrorClass::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let detail = match class {
            ErrorClass::Busy | ErrorClass::Lost | ErrorClass::InvalidInput => e.to_string(),
            ErrorClass::Unavailable => {
                tracing::warn!(error = %e, "lock error answered with {status}");
                "the lock service is unavailable; retry later".to_string()
            }
            _ => {
                tracing::warn!(error = %e, "lock error answered with {status}");
                "the server's lock configuration is wrong".to_string()
            }
        };
        let problem = Self::new(status, e.code(), detail);
        match e.retry_after() {
            Some(d) => problem.retry_after(d.as_secs() + u64::from(d.subsec_nanos() > 0)),
            None => problem,
        }
    }
}

impl From<LockError> for Problem {
    /// As [`From<&LockError>`](#impl-From%3C%26LockError%3E-for-Problem).
    fn from(e: LockError) -> Self {
        Self::from(&e)
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for Problem {
    fn into_response(self) -> axum::response::Response {
        self.into_http_response()
    }
}

/// A problem response, for the layers.
pub(crate) fn problem<B: From<Bytes>>(
    status: StatusCode,
    kind: &'static str,
    detail: &str,
) -> Response<B> {
    Problem::new(status, kind, detail).into_http_response()
}

/// Appends `s` as a JSON string literal to `out`: the one escaper. Runs of bytes that
/// need no escape go in one copy (a problem's strings rarely hold any that do).
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    let mut plain = 0;
    for (at, b) in s.bytes().enumerate() {
        if b != b'"' && b != b'\\' && b >= 0x20 {
            continue;
        }
        // Every byte escaped here is ASCII, so `plain..at` ends on a char boundary.
        out.push_str(&s[plain..at]);
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            _ => {
                let _ = write!(out, "\\u{b:04x}");
            }
        }
        plain = at + 1;
    }
    out.push_str(&s[plain..]);
    out.push('"');
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn body_is_escaped_json() {
        let r: Response<Bytes> = problem(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            "a \"b\"\n\t\\",
        );
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(
            r.body(),
            r#"{"type":"rate-limited","title":"Too Many Requests","status":429,"detail":"a \"b\"\n\u0009\\"}"#
        );
    }

    /// Every string, escaped, reads back as itself: random strings drawn from the
    /// characters that need an escape, plain ASCII and multi-byte ones.
    #[test]
    fn every_string_reads_back_from_its_json() {
        let mut rng = fastrand::Rng::with_seed(5);
        let alphabet = [
            '"', '\\', '\n', '\t', '\0', '\u{1f}', '\u{7f}', 'a', ' ', '/', 'é', '€', '😀',
        ];
        for _ in 0..2000 {
            let s: String = (0..rng.usize(..12))
                .map(|_| alphabet[rng.usize(..alphabet.len())])
                .collect();
            let mut json = String::new();
            json_string(&mut json, &s);
            let back: String =
                serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(back, s, "{json}");
        }
        let p = Problem::new(StatusCode::CONFLICT, "k\"", "d\n").member("m\\", "v\u{1}");
        let body: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"type": "k\"", "title": "Conflict", "status": 409, "detail": "d\n", "m\\": "v\u{1}"})
        );
    }

    #[test]
    fn lock_errors_as_problems() {
        let busy = LockError::Busy {
            key: "k\"1".into(),
            retry_after: Duration::from_millis(10),
        };
        let r: Response<Bytes> = Problem::from(&busy).into_http_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        let body = String::from_utf8(r.body().to_vec()).unwrap();
        assert!(body.starts_with(r#"{"type":"lock-busy","title":"Conflict""#));
        assert!(body.contains(r#"lock `k\"1`"#), "{body}");

        let down = LockError::RedisTimeout {
            op: "acquire",
            after: Duration::from_secs(2),
        };
        let p = Problem::from(down);
        assert_eq!(p.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(p.kind(), "lock-service-unavailable");
        assert!(!p.to_json().contains("acquire"), "internals leak: {p:?}");
        let store = LockError::Store {
            store: "mysql",
            message: "secret host".into(),
        };
        let p = Problem::from(store);
        assert_eq!(p.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!p.to_json().contains("secret"), "internals leak: {p:?}");
        let bad = Problem::from(LockError::InvalidKey("part 1 is empty".into()));
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        let conf = Problem::from(LockError::InvalidConfig("no global client".into()));
        assert_eq!(conf.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let r: Response<Bytes> = conf.into_http_response();
        assert!(r.headers().get(RETRY_AFTER).is_none());
    }
}
