use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::{Request, Response, StatusCode};
use lock_core::LockError;
use pin_project_lite::pin_project;
use tower::Service;

use crate::problem::problem;

type Consume = Pin<Box<dyn Future<Output = Result<bool, LockError>> + Send>>;

pin_project! {
    /// Response future of [`OneTimeTokenService`](super::OneTimeTokenService).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        Consuming {
            consume: Consume,
            inner: Option<(S, Request<B>)>,
            fail_closed: bool,
        },
        Calling {
            #[pin]
            future: S::Future,
        },
        Done {
            response: Option<S::Response>,
        },
    }
}

impl<S, B> std::fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn consuming(
        consume: Consume,
        inner: S,
        request: Request<B>,
        fail_closed: bool,
    ) -> Self {
        Self {
            state: State::Consuming {
                consume,
                inner: Some((inner, request)),
                fail_closed,
            },
        }
    }

    pub(crate) fn passing(future: S::Future) -> Self {
        Self {
            state: State::Calling { future },
        }
    }

    pub(crate) fn rejected(response: S::Response) -> Self {
        Self {
            state: State::Done {
                response: Some(response),
            },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: From<String>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Consuming {
                    consume,
                    inner,
                    fail_closed,
                } => {
                    let outcome = ready!(consume.as_mut().poll(cx));
                    let Some((mut service, request)) = inner.take() else {
                        // Polled again after completion: nothing left to do.
                        return Poll::Pending;
                    };
                    let reject = |status, kind, detail| State::Done {
                        response: Some(problem(status, kind, detail)),
                    };
                    let next = match outcome {
                        Ok(true) => State::Calling {
                            future: service.call(request),
                        },
                        Ok(false) => reject(
                            StatusCode::CONFLICT,
                            "one-time-token-used",
                            "the token is unknown, expired or already used; fetch a new one",
                        ),
                        Err(e) if e.is_redis() && !*fail_closed => {
                            tracing::warn!(error = %e, "one-time tokens unavailable; failing open");
                            State::Calling {
                                future: service.call(request),
                            }
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
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future } => return future.poll(cx),
                StateProj::Done { response } => {
                    return match response.take() {
                        Some(r) => Poll::Ready(Ok(r)),
                        None => Poll::Pending,
                    };
                }
            }
        }
    }
}
