use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, Request, Response, StatusCode};
use tower::Service;

use super::layer::Settings;
use crate::ResponseBody;
use crate::check::{ResponseFuture, Verdict};
use crate::problem::problem;

/// The token-checking service made by [`OneTimeTokenLayer`](super::OneTimeTokenLayer).
///
/// Its responses are `Response<`[`ResponseBody`]`<R>>` for an inner `Response<R>`: the
/// inner body, or the problem the layer wrote (so `R` needs no `From<String>`).
#[derive(Debug, Clone)]
pub struct OneTimeTokenService<S> {
    pub(crate) inner: S,
    pub(crate) settings: Arc<Settings>,
}

impl<S> OneTimeTokenService<S> {
    /// The inner service.
    ///
    /// ```no_run
    /// use lock_tower::one_time_token::OneTimeTokenLayer;
    /// use tower::Layer;
    ///
    /// #[derive(Debug, Clone, PartialEq)]
    /// struct Counter(u32);
    ///
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::open("redis://127.0.0.1:6379/").await?;
    /// let tokens = client.one_time_tokens("forms");
    /// let mut service = OneTimeTokenLayer::new(tokens, "checkout").layer(Counter(0));
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

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for OneTimeTokenService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
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
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let s = &self.settings;
        if !s.methods.contains(request.method()) {
            return ResponseFuture::passing(inner.call(request));
        }
        let token = request
            .headers()
            .get(&s.header)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_owned());
        let Some(token) = token.filter(|t| !t.is_empty()) else {
            return ResponseFuture::answered(problem(
                StatusCode::BAD_REQUEST,
                "one-time-token-missing",
                &format!("this request must carry a token in the {} header", s.header),
            ));
        };
        let check = Box::pin(consume(s.clone(), token));
        ResponseFuture::checking(check, inner, request)
    }
}

/// Consumes `token` and decides: pass, 409 (unknown, expired or used), or (Redis
/// unreachable) 503 or fail open; a refused setting is 500.
async fn consume(settings: Arc<Settings>, token: String) -> Verdict {
    let reject = |status, kind, detail| Verdict::Respond(problem(status, kind, detail));
    match settings
        .tokens
        .consume(settings.scope.as_str(), &token)
        .await
    {
        Ok(true) => Verdict::Call(HeaderMap::new()),
        Ok(false) => reject(
            StatusCode::CONFLICT,
            "one-time-token-used",
            "the token is unknown, expired or already used; fetch a new one",
        ),
        Err(e) if e.is_redis() && !settings.fail_closed => {
            tracing::warn!(error = %e, "one-time tokens unavailable; failing open");
            Verdict::Call(HeaderMap::new())
        }
        Err(e) if e.is_redis() => {
            tracing::warn!(error = %e, "one-time tokens unavailable; failing closed");
            reject(
                StatusCode::SERVICE_UNAVAILABLE,
                "one-time-token-unavailable",
                "tokens cannot be checked right now; retry later",
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "one-time token layer misconfigured");
            reject(
                StatusCode::INTERNAL_SERVER_ERROR,
                "one-time-token-misconfigured",
                "the server's token settings are wrong",
            )
        }
    }
}
