use lock_core::RateLimiter;
use tower::Layer;

use super::RateLimitService;
use super::verdict::Limits;

/// Applies a GCRA rate limit to every request; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct RateLimitLayer<K> {
    pub(crate) limiter: RateLimiter,
    pub(crate) extractor: K,
    pub(crate) fail_closed: bool,
}

impl<K> RateLimitLayer<K> {
    /// Limits requests per key (from `extractor`) with `limiter`'s quota.
    pub fn new(limiter: RateLimiter, extractor: K) -> Self {
        Self {
            limiter,
            extractor,
            fail_closed: false,
        }
    }

    /// When Redis cannot be asked: `false` (the default) lets requests through and logs a
    /// warning (fail open); `true` answers 503 (fail closed).
    pub fn fail_closed(mut self, fail_closed: bool) -> Self {
        self.fail_closed = fail_closed;
        self
    }
}

impl<S, K: Clone> Layer<S> for RateLimitLayer<K> {
    type Service = RateLimitService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimitService {
            inner,
            extractor: self.extractor.clone(),
            limits: Limits::new(self.limiter.clone(), self.fail_closed),
        }
    }
}
