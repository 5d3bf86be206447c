use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response, StatusCode};
use tower::Service;

use super::future::ResponseFuture;
use super::layer::Settings;
use crate::problem::problem;

/// The token-checking service made by [`OneTimeTokenLayer`](super::OneTimeTokenLayer).
#[derive(Debug, Clone)]
pub struct OneTimeTokenService<S> {
    pub(crate) inner: S,
    pub(crate) settings: Arc<Settings>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for OneTimeTokenService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
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
            return ResponseFuture::rejected(problem(
                StatusCode::BAD_REQUEST,
                "one-time-token-missing",
                &format!("this request must carry a token in the {} header", s.header),
            ));
        };
        let settings = s.clone();
        let consume = Box::pin(async move {
            settings
                .tokens
                .consume(settings.scope.as_str(), &token)
                .await
        });
        ResponseFuture::consuming(consume, inner, request, s.fail_closed)
    }
}
