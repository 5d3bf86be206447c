//! What the limiter's answer means for a request: pass with the RateLimit headers, 429,
//! or (Redis unreachable or misconfigured) fail open, 503 or 500.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use lock_core::{Decision, RateLimiter};

use super::key::LimitKey;
use crate::check::Verdict;
use crate::problem::problem;

/// Asks `limiter` about `key` and decides.
pub(crate) async fn check(limiter: RateLimiter, key: LimitKey, fail_closed: bool) -> Verdict {
    match limiter.check(key).await {
        Ok(d) if d.allowed => Verdict::Call(rate_headers(&d)),
        Ok(d) => Verdict::Respond(too_many(&d)),
        // Only an unreachable Redis follows the fail-open setting: a refused key or
        // setting must never switch the limit off.
        Err(e) if !e.is_redis() => {
            let limit = limiter.limit();
            tracing::error!(error = %e, ?limit, "rate limit misconfigured");
            Verdict::Respond(problem(
                StatusCode::INTERNAL_SERVER_ERROR,
                "rate-limit-misconfigured",
                "the server's rate-limit settings are wrong",
            ))
        }
        Err(e) if fail_closed => {
            tracing::warn!(error = %e, "rate limit unavailable; failing closed");
            lock_core::__private::rate_limit_failed(false);
            Verdict::Respond(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "rate-limit-unavailable",
                "the rate limiter is unavailable; retry later",
            ))
        }
        Err(e) => {
            let limit = limiter.limit();
            tracing::warn!(error = %e, ?limit, "rate limit unavailable; failing open");
            lock_core::__private::rate_limit_failed(true);
            Verdict::Call(HeaderMap::new())
        }
    }
}

fn secs_ceil(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The IETF `RateLimit-Policy` and `RateLimit` headers
/// (draft-ietf-httpapi-ratelimit-headers): quota `q` = the burst, window `w` = the time
/// to refill it; remaining `r`, and `t` = seconds until the quota is full again.
fn rate_headers(d: &Decision) -> HeaderMap {
    let limit = d.limit;
    let window = secs_ceil(limit.emission_interval() * limit.burst()).max(1);
    let mut h = HeaderMap::new();
    let policy = format!("\"default\";q={};w={window}", limit.burst());
    let state = format!(
        "\"default\";r={};t={}",
        d.remaining,
        secs_ceil(d.reset_after)
    );
    for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(HeaderName::from_static(name), v);
        }
    }
    h
}

fn too_many(d: &Decision) -> Response<Bytes> {
    let retry = secs_ceil(d.retry_after.unwrap_or_default()).max(1);
    let mut r = problem(
        StatusCode::TOO_MANY_REQUESTS,
        "rate-limited",
        &format!("too many requests; retry in {retry} s"),
    );
    r.headers_mut().extend(rate_headers(d));
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry));
    r
}
