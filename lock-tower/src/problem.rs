//! `application/problem+json` responses (RFC 9457): the one way this crate rejects.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

/// A problem response with `type`, `title`, `status` and `detail`.
pub(crate) fn problem<B: From<Bytes>>(status: StatusCode, kind: &str, detail: &str) -> Response<B> {
    let body = format!(
        "{{\"type\":{},\"title\":{},\"status\":{},\"detail\":{}}}",
        json_string(kind),
        json_string(status.canonical_reason().unwrap_or("Error")),
        status.as_u16(),
        json_string(detail)
    );
    let mut response = Response::new(B::from(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_escaped_json() {
        let r: Response<Bytes> =
            problem(StatusCode::TOO_MANY_REQUESTS, "rate-limited", "a \"b\"\n");
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
        assert_eq!(
            r.body(),
            r#"{"type":"rate-limited","title":"Too Many Requests","status":429,"detail":"a \"b\"\u000a"}"#
        );
    }
}
