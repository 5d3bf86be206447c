//! The one "check, then call" response future of the rate-limit and one-time-token
//! layers (the shape of `tower::filter::future::AsyncResponseFuture`): an asynchronous
//! check decides whether the inner service is called at all.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use pin_project_lite::pin_project;
use tower::Service;

use crate::ResponseBody;

/// What a check decided.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// Call the inner service; add these headers to its response.
    Call(HeaderMap),
    /// Answer with this response (a problem the layer wrote); the inner service is not
    /// called.
    Respond(Response<Bytes>),
}

/// A check in progress.
pub(crate) type Check = Pin<Box<dyn Future<Output = Verdict> + Send>>;

pin_project! {
    /// Response future of [`RateLimitService`](crate::rate_limit::RateLimitService) and
    /// [`OneTimeTokenService`](crate::one_time_token::OneTimeTokenService): the layer's
    /// check (a Redis round trip), then the inner service's call, or the layer's own
    /// answer.
    ///
    /// # Panics
    ///
    /// Polled again after it returned `Poll::Ready` (a bug in the caller, as for any
    /// future), it panics with "`ResponseFuture` polled after completion" instead of
    /// hanging.
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S::Future>,
        // The service and request the check decides about; taken when it passes.
        call: Option<(S, Request<B>)>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Checking {
            check: Check,
        },
        Calling {
            #[pin]
            future: F,
            headers: HeaderMap,
        },
        Answered {
            response: Option<Response<Bytes>>,
        },
        Done,
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
    /// Runs `check`, then calls `service` with `request` if it passes.
    pub(crate) fn checking(check: Check, service: S, request: Request<B>) -> Self {
        Self {
            state: State::Checking { check },
            call: Some((service, request)),
        }
    }

    /// No check: the inner call as is.
    pub(crate) fn passing(future: S::Future) -> Self {
        Self {
            state: State::Calling {
                future,
                headers: HeaderMap::new(),
            },
            call: None,
        }
    }

    /// Refused before any check: `response`, and the inner service is not called.
    pub(crate) fn answered(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
            call: None,
        }
    }
}

impl<S, B, R> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<R>>,
{
    type Output = Result<Response<ResponseBody<R>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Checking { check } => {
                    let verdict = ready!(check.as_mut().poll(cx));
                    let next = match (verdict, this.call.take()) {
                        (Verdict::Call(headers), Some((mut service, request))) => State::Calling {
                            future: service.call(request),
                            headers,
                        },
                        (Verdict::Respond(response), _) => State::Answered {
                            response: Some(response),
                        },
                        // `call` is only taken here, on leaving `Checking`.
                        (Verdict::Call(_), None) => unreachable!("a check passed twice"),
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future, headers } => {
                    let result = ready!(future.poll(cx));
                    let headers = std::mem::take(headers);
                    this.state.set(State::Done);
                    let mut response = result?;
                    // Appended: a layer further in may have written its own items of
                    // the same fields (stacked rate limits), which stay.
                    let mut name = None;
                    for (n, value) in headers {
                        name = n.or(name);
                        if let Some(name) = &name {
                            response.headers_mut().append(name.clone(), value);
                        }
                    }
                    return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                }
                StateProj::Answered { response } => {
                    let response = response.take().map(|r| r.map(ResponseBody::full));
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response.unwrap_or_else(|| polled_after_completion())));
                }
                StateProj::Done => polled_after_completion(),
            }
        }
    }
}

/// The documented panic of every response future in this crate polled again after it
/// returned `Poll::Ready` (a caller bug: waiting forever would hide it).
#[track_caller]
pub(crate) fn polled_after_completion() -> ! {
    panic!("`ResponseFuture` polled after completion")
}
