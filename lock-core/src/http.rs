//! `LockError` as an HTTP response (feature `axum`).
//!
//! | error | status | `type` |
//! | --- | --- | --- |
//! | [`Busy`](LockError::Busy) | 409, `Retry-After` from the holder's remaining lease | `lock-busy` |
//! | [`Timeout`](LockError::Timeout) | 409, `Retry-After: 1` | `lock-wait-timeout` |
//! | [`NotOwner`](LockError::NotOwner), [`Expired`](LockError::Expired) | 409 | `lock-lost` |
//! | [`InvalidKey`](LockError::InvalidKey) | 400 | `invalid-lock-key` |
//! | Redis down, timed out or answering oddly | 503, `Retry-After: 1` | `lock-service-unavailable` |
//! | [`IdsUnavailable`](LockError::IdsUnavailable) | 503, `Retry-After: 1` | `ids-unavailable` |
//! | anything else (a configuration mistake) | 500 | `lock-misconfigured` |
//!
//! Bodies are `application/problem+json` (RFC 9457).

use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Response, StatusCode};

use crate::LockError;

impl LockError {
    /// The HTTP status, problem `type` and `Retry-After` seconds for this error.
    fn http_parts(&self) -> (StatusCode, &'static str, Option<u64>) {
        match self {
            LockError::Busy { retry_after, .. } => (
                StatusCode::CONFLICT,
                "lock-busy",
                Some(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            ),
            LockError::Timeout { .. } => (StatusCode::CONFLICT, "lock-wait-timeout", Some(1)),
            LockError::NotOwner { .. } | LockError::Expired { .. } => {
                (StatusCode::CONFLICT, "lock-lost", None)
            }
            LockError::InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid-lock-key", None),
            e if e.is_unavailable() => (
                StatusCode::SERVICE_UNAVAILABLE,
                "lock-service-unavailable",
                Some(1),
            ),
            LockError::IdsUnavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "ids-unavailable", Some(1))
            }
            _ => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "lock-misconfigured",
                None,
            ),
        }
    }

    /// This error as an `application/problem+json` response (see the table in the
    /// module docs).
    ///
    /// ```
    /// use std::time::Duration;
    /// let e = lock_core::LockError::Busy { key: "order:7".into(), retry_after: Duration::from_millis(1500) };
    /// let r = e.to_http_response();
    /// assert_eq!(r.status(), 409);
    /// assert_eq!(r.headers()["retry-after"], "2");
    /// assert!(r.body().contains("\"type\":\"lock-busy\""));
    /// ```
    pub fn to_http_response(&self) -> Response<String> {
        let (status, kind, retry) = self.http_parts();
        // Internal details (Redis errors, configuration) stay in the server log.
        let detail = if status.is_server_error() {
            tracing::warn!(error = %self, "lock error answered with {status}");
            match status {
                StatusCode::SERVICE_UNAVAILABLE => {
                    "the lock service is unavailable; retry later".to_string()
                }
                _ => "the server's lock configuration is wrong".to_string(),
            }
        } else {
            self.to_string()
        };
        let body = format!(
            "{{\"type\":\"{kind}\",\"title\":{},\"status\":{},\"detail\":{}}}",
            json_string(status.canonical_reason().unwrap_or("Error")),
            status.as_u16(),
            json_string(&detail)
        );
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(secs) = retry {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl axum_core::response::IntoResponse for LockError {
    fn into_response(self) -> axum_core::response::Response {
        self.to_http_response().map(axum_core::body::Body::from)
    }
}

/// A JSON string literal for `s`.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn statuses_and_bodies() {
        let busy = LockError::Busy {
            key: "k\"1".into(),
            retry_after: Duration::from_millis(10),
        };
        let r = busy.to_http_response();
        assert_eq!(r.status(), StatusCode::CONFLICT);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        assert!(r.body().contains(r#"lock `k\"1`"#), "{}", r.body());

        let timeout = LockError::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(2),
        };
        assert_eq!(timeout.to_http_response().status(), StatusCode::CONFLICT);
        let down = LockError::RedisTimeout {
            op: "acquire",
            after: Duration::from_secs(2),
        };
        let r = down.to_http_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            !r.body().contains("acquire"),
            "internals leak: {}",
            r.body()
        );
        let bad = LockError::InvalidKey("part 1 is empty".into());
        assert_eq!(bad.to_http_response().status(), StatusCode::BAD_REQUEST);
        let conf = LockError::InvalidConfig("no global client".into());
        assert_eq!(conf.to_http_response().status(), 500);
    }
}
