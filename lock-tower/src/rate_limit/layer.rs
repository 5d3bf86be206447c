use std::sync::Arc;

use lock_core::{LockError, RateLimiter};
use tower::Layer;

use super::RateLimitService;
use super::verdict::Limits;

/// Applies a GCRA rate limit to every request; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct RateLimitLayer<K> {
    pub(crate) limiter: RateLimiter,
    pub(crate) extractor: K,
    pub(crate) fail_closed: bool,
    pub(crate) policy_name: Arc<str>,
}

impl<K> RateLimitLayer<K> {
    /// Limits requests per key (from `extractor`) with `limiter`'s quota.
    pub fn new(limiter: RateLimiter, extractor: K) -> Self {
        Self {
            limiter,
            extractor,
            fail_closed: false,
            policy_name: Arc::from("default"),
        }
    }

    /// When Redis cannot be asked: `false` (the default) lets requests through and logs a
    /// warning (fail open); `true` answers 503 (fail closed).
    pub fn fail_closed(mut self, fail_closed: bool) -> Self {
        self.fail_closed = fail_closed;
        self
    }

    /// The name of this layer's limit in its `RateLimit-Policy` and `RateLimit` items
    /// (default `"default"`): 1 to 64 printable ASCII characters, neither `"` nor `\`.
    /// Layers stacked on one route each add their own item, so give each its own name.
    ///
    /// ```
    /// # fn demo(per_user: lock_core::RateLimiter) -> Result<(), lock_core::LockError> {
    /// use lock_tower::rate_limit::{HeaderKey, RateLimitLayer};
    ///
    /// let key = HeaderKey(http::HeaderName::from_static("x-user-id"));
    /// // Responses carry `RateLimit-Policy: "per-user";q=...;w=...`.
    /// let layer = RateLimitLayer::new(per_user, key).policy_name("per-user")?;
    /// # let _ = layer; Ok(()) }
    /// ```
    pub fn policy_name(mut self, name: &str) -> Result<Self, LockError> {
        let printable = |c: char| (' '..='~').contains(&c) && c != '"' && c != '\\';
        if name.is_empty() || name.len() > 64 || !name.chars().all(printable) {
            return Err(LockError::InvalidConfig(format!(
                "rate-limit policy name {name:?}: 1 to 64 printable ASCII characters, \
                 neither '\"' nor '\\'"
            )));
        }
        self.policy_name = Arc::from(name);
        Ok(self)
    }
}

impl<S, K: Clone> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimitService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            extractor: self.extractor.clone(),
            limits: Limits::new(
                self.limiter.clone(),
                self.fail_closed,
                self.policy_name.clone(),
            ),
        }
    }
}
