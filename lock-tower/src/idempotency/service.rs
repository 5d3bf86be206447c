use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower::Service;

use super::future::ResponseFuture;
use super::key::validate;
use super::scope::{Principal, Scope};
use super::settings::Settings;
use crate::body::BoxError;
use crate::problem::problem;
use crate::{KeyExtractor, ResponseBody};

/// What the layer hands every service it makes (one `Arc` clone per request).
#[derive(Debug)]
pub(crate) struct Shared<K, P> {
    pub(crate) settings: Arc<Settings>,
    pub(crate) extractor: K,
    pub(crate) principal: P,
}

/// The idempotency service made by [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Debug)]
pub struct IdempotencyService<S, K, P> {
    pub(crate) inner: S,
    pub(crate) shared: Arc<Shared<K, P>>,
}

impl<S, K, P> IdempotencyService<S, K, P> {
    /// The inner service.
    ///
    /// ```no_run
    /// use lock_tower::idempotency::IdempotencyLayer;
    /// use tower::Layer;
    ///
    /// #[derive(Debug, Clone, PartialEq)]
    /// struct Counter(u32);
    ///
    /// # async fn f() -> Result<(), lock_core::LockError> {
    /// let client = lock_core::LockClient::open("redis://127.0.0.1:6379/").await?;
    /// let store = client.idempotency_store("payments");
    /// let mut service = IdempotencyLayer::new(store).layer(Counter(0));
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

impl<S: Clone, K, P> Clone for IdempotencyService<S, K, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, K, P, B, ResBody> Service<Request<B>> for IdempotencyService<S, K, P>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: KeyExtractor<B>,
    P: Principal<B>,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The readied service answers this request; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = &self.shared;
        let settings = &shared.settings;
        if !settings.methods.contains(request.method()) {
            return ResponseFuture::passing(inner.call(request));
        }
        let extracted = shared
            .extractor
            .extract(&request)
            .and_then(|key| key.map(|k| validate(&k).map(|()| k)).transpose());
        let key = match extracted {
            Ok(Some(key)) => key,
            Ok(None) if settings.require_key => {
                return ResponseFuture::rejected(problem(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-missing",
                    "this request must carry an idempotency key",
                ));
            }
            Ok(None) => return ResponseFuture::passing(inner.call(request)),
            Err(why) => {
                return ResponseFuture::rejected(problem(
                    StatusCode::BAD_REQUEST,
                    "idempotency-key-invalid",
                    &why,
                ));
            }
        };
        let principal = shared
            .principal
            .principal(&request)
            .filter(|p| !p.is_empty());
        if principal.is_none() && !settings.allow_anonymous {
            return ResponseFuture::rejected(problem(
                StatusCode::BAD_REQUEST,
                "idempotency-principal-missing",
                "this request carries an idempotency key but does not say who sent it \
                 (no credentials), so its response could be replayed to anyone",
            ));
        }
        let scope = Scope::new(request.method(), request.uri().path(), principal, key);
        ResponseFuture::preparing(settings.clone(), scope, request, inner)
    }
}
