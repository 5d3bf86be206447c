use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;

use super::phases::{BoxFuture, Prepared, Running, finish, prepare};
use super::scope::Scope;
use super::settings::Settings;
use crate::ResponseBody;
use crate::body::BoxError;
use crate::check::polled_after_completion;

pin_project! {
    /// Response future of [`IdempotencyService`](super::IdempotencyService).
    ///
    /// Dropped before it completes (the client went away) or unwound by a panicking
    /// handler, it frees the claimed key in the background.
    ///
    /// # Panics
    ///
    /// Polled again after it returned `Poll::Ready` (a bug in the caller, as for any
    /// future), it panics with "`ResponseFuture` polled after completion" instead of
    /// hanging.
    pub struct ResponseFuture<S, B, R>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B, R>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B, R>
    where
        S: Service<Request<B>>,
    {
        // Buffering the body and claiming the key.
        Preparing {
            prepare: BoxFuture<Prepared<B, Response<ResponseBody<R>>>>,
            inner: Option<S>,
            settings: Arc<Settings>,
        },
        // The handler runs; `running` is the claim (none: unprotected).
        Calling {
            #[pin]
            future: S::Future,
            running: Option<Running>,
        },
        // Reading the response and storing it, or freeing the key.
        Finishing {
            finish: BoxFuture<Response<ResponseBody<R>>>,
        },
        Done {
            response: Option<Response<ResponseBody<R>>>,
        },
    }
}

impl<S, B, R> std::fmt::Debug for ResponseFuture<S, B, R>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B, R> ResponseFuture<S, B, R>
where
    S: Service<Request<B>>,
{
    /// Protected: buffer the body and claim `scope`, then call `inner` (or answer).
    pub(crate) fn preparing(
        settings: Arc<Settings>,
        scope: Scope,
        request: Request<B>,
        inner: S,
    ) -> Self
    where
        B: Body + From<Bytes> + Send + 'static,
        B::Data: Send,
        B::Error: Into<BoxError>,
        R: Send + 'static,
    {
        Self {
            state: State::Preparing {
                prepare: Box::pin(prepare(settings.clone(), scope, request)),
                inner: Some(inner),
                settings,
            },
        }
    }

    /// Unprotected: the inner call as is.
    pub(crate) fn passing(future: S::Future) -> Self {
        Self {
            state: State::Calling {
                future,
                running: None,
            },
        }
    }

    pub(crate) fn rejected(response: Response<ResponseBody<R>>) -> Self {
        Self {
            state: State::Done {
                response: Some(response),
            },
        }
    }
}

impl<S, B, R> Future for ResponseFuture<S, B, R>
where
    S: Service<Request<B>, Response = Response<R>>,
    R: Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<R>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Preparing {
                    prepare,
                    inner,
                    settings,
                } => {
                    let next = match ready!(prepare.as_mut().poll(cx)) {
                        Prepared::Respond(response) => State::Done {
                            response: Some(response),
                        },
                        Prepared::Run { request, claim } => match inner.take() {
                            Some(mut service) => State::Calling {
                                future: service.call(request),
                                running: claim.map(|c| Running::new(c, settings.clone())),
                            },
                            // `inner` is only taken here, on leaving `Preparing`.
                            None => unreachable!("an idempotent request ran twice"),
                        },
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future, running } => {
                    let Poll::Ready(result) = future.poll(cx) else {
                        if let Some(r) = running.as_mut() {
                            r.poll_keep_alive(cx);
                        }
                        return Poll::Pending;
                    };
                    let running = running.take();
                    this.state.set(State::Done { response: None });
                    // A service error drops `running`: the claim frees the key.
                    let response = result?;
                    match running {
                        None => return Poll::Ready(Ok(response.map(ResponseBody::inner))),
                        Some(r) => {
                            let finish = Box::pin(finish(response, r));
                            this.state.set(State::Finishing { finish });
                        }
                    }
                }
                StateProj::Finishing { finish } => {
                    let response = ready!(finish.as_mut().poll(cx));
                    this.state.set(State::Done { response: None });
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done { response } => {
                    return match response.take() {
                        Some(r) => Poll::Ready(Ok(r)),
                        None => polled_after_completion(),
                    };
                }
            }
        }
    }
}
