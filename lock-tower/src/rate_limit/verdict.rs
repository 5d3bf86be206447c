//! What the limiter's answer means for a request: pass with the RateLimit headers, 429,
//! or (Redis unreachable or misconfigured) fail open, 503 or 500.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use lock_core::{Decision, RateLimit, RateLimiter};

use super::key::LimitKey;
use crate::check::Verdict;
use crate::problem::problem;

/// What a layer decides with, shared by its services' clones (axum clones a route's
/// service for every request).
#[derive(Debug)]
pub(crate) struct Limits {
    limiter: RateLimiter,
    fail_closed: bool,
    /// The name of this layer's items in both headers.
    name: Arc<str>,
    /// The `RateLimit-Policy` header: fixed by the limiter's quota, so built once.
    policy: Option<HeaderValue>,
}

/// Asks the limiter about `key` and decides.
pub(crate) async fn check(limits: Arc<Limits>, key: LimitKey) -> Verdict {
    let limiter = &limits.limiter;
    match limiter.check(key).await {
        Ok(d) if d.allowed => Verdict::Call(limits.headers(&d)),
        Ok(d) => Verdict::Respond(limits.too_many(&d)),
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
        Err(e) if limits.fail_closed => {
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
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// The IETF `RateLimit-Policy` value of `limit`
/// (draft-ietf-httpapi-ratelimit-headers): quota `q` = the burst, window `w` = the time
/// to refill it.
fn policy(name: &str, limit: &RateLimit) -> String {
    // Checked: a quota the limiter will refuse (a period past 24 h) must not panic here.
    let refill = limit.emission_interval().checked_mul(limit.burst());
    let window = secs_ceil(refill.unwrap_or(Duration::MAX)).max(1);
    format!("\"{name}\";q={};w={window}", limit.burst())
}

impl Limits {
    pub(crate) fn new(limiter: RateLimiter, fail_closed: bool, name: Arc<str>) -> Arc<Self> {
        let policy = HeaderValue::try_from(policy(&name, &limiter.limit())).ok();
        Arc::new(Self {
            limiter,
            fail_closed,
            name,
            policy,
        })
    }

    /// The `RateLimit-Policy` (built once per layer) and `RateLimit` headers: remaining
    /// `r`, and `t` = seconds until the quota is full again.
    fn headers(&self, d: &Decision) -> HeaderMap {
        let mut h = HeaderMap::with_capacity(2);
        if let Some(policy) = &self.policy {
            h.insert(HeaderName::from_static("ratelimit-policy"), policy.clone());
        }
        let state = format!(
            "\"{}\";r={};t={}",
            self.name,
            d.remaining,
            secs_ceil(d.reset_after)
        );
        // From the String itself: no copy.
        if let Ok(v) = HeaderValue::try_from(state) {
            h.insert(HeaderName::from_static("ratelimit"), v);
        }
        h
    }

    fn too_many(&self, d: &Decision) -> Response<Bytes> {
        let retry = secs_ceil(d.retry_after.unwrap_or_default()).max(1);
        let mut r = problem(
            StatusCode::TOO_MANY_REQUESTS,
            "rate-limited",
            &format!("too many requests; retry in {retry} s"),
        );
        r.headers_mut().extend(self.headers(d));
        r.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_of_any_quota_is_written() {
        let minute = RateLimit::per_minute(30).with_burst(10);
        assert_eq!(policy("default", &minute), "\"default\";q=10;w=20");
        // Refused by the limiter on its first check (500 misconfigured), never a panic
        // where the layer is built.
        let absurd = RateLimit::new(1, Duration::MAX).with_burst(2);
        assert_eq!(
            policy("default", &absurd),
            format!("\"default\";q=2;w={}", u64::MAX)
        );
    }
}
