use std::task::{Context, Poll};

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use tower::Service;

use super::key::LimitKey;
use super::verdict::{Limits, check};
use crate::check::ResponseFuture;
use crate::problem::problem;
use crate::{KeyExtractor, ResponseBody};

/// The rate-limiting service made by [`RateLimitLayer`](super::RateLimitLayer).
///
/// Its responses are `Response<`[`ResponseBody`]`<R>>` for an inner `Response<R>`: the
/// inner body, or the problem the layer wrote (so `R` needs no `From<String>`).
#[derive(Debug, Clone)]
pub struct RateLimitService<S, K> {
    pub(crate) inner: S,
    pub(crate) extractor: K,
    pub(crate) limits: Arc<Limits>,
}

impl<S, K> RateLimitService<S, K> {
    /// The inner service.
    ///
    /// ```no_run
    /// use lock_tower::rate_limit::{PeerIp, RateLimitLayer};
    /// use tower::Layer;
    ///
    /// #[derive(Debug, Clone, PartialEq)]
    /// struct Counter(u32);
    ///
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::open("redis://127.0.0.1:6379/").await?;
    /// let limiter = client.rate_limiter("api", lock_core::RateLimit::per_second(5));
    /// let mut service = RateLimitLayer::new(limiter, PeerIp::new()).layer(Counter(0));
    /// service.get_mut().0 += 1;
    /// assert_eq!(service.get_ref(), &Counter(1));
    /// assert_eq!(service.into_inner(), Counter(1));
    /// # Ok(()) }
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, consuming the layer's.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, K, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimitService<S, K>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    K: KeyExtractor<ReqBody>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The readied service answers this request; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        match self
            .extractor
            .extract(&request)
            .map(|k| k.and_then(LimitKey::new))
        {
            Ok(Some(key)) => {
                let check = Box::pin(check(self.limits.clone(), key));
                ResponseFuture::checking(check, inner, request)
            }
            Ok(None) => ResponseFuture::answered(problem(
                StatusCode::BAD_REQUEST,
                "rate-limit-key-missing",
                "the request does not say who it is from, so it cannot be rate limited",
            )),
            Err(why) => ResponseFuture::answered(problem(
                StatusCode::BAD_REQUEST,
                "rate-limit-key-invalid",
                &why,
            )),
        }
    }
}
