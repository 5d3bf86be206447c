use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use lock_core::RateLimiter;
use tower::Service;

use super::future::ResponseFuture;
use super::key::{KeyExtractor, LimitKey};
use crate::problem::problem;

/// The rate-limiting service made by [`RateLimitLayer`](super::RateLimitLayer).
#[derive(Debug, Clone)]
pub struct RateLimitService<S, K> {
    pub(crate) inner: S,
    pub(crate) limiter: RateLimiter,
    pub(crate) extractor: K,
    pub(crate) fail_closed: bool,
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<ReqBody>,
    ResBody: From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The readied service answers this request; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        match self.extractor.extract(&request).and_then(LimitKey::new) {
            Some(key) => {
                let limiter = self.limiter.clone();
                let check = Box::pin(async move { limiter.check(key).await });
                ResponseFuture::checking(
                    check,
                    inner,
                    request,
                    self.fail_closed,
                    self.limiter.limit(),
                )
            }
            None => ResponseFuture::rejected(problem(
                StatusCode::BAD_REQUEST,
                "rate-limit-key-missing",
                "the request does not say who it is from, so it cannot be rate limited",
            )),
        }
    }
}
