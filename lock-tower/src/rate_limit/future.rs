use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Request, Response, StatusCode};
use lock_core::{Decision, LockError, RateLimit};
use pin_project_lite::pin_project;
use tower::Service;

use crate::problem::problem;

type Check = Pin<Box<dyn Future<Output = Result<Decision, LockError>> + Send>>;

pin_project! {
    /// Response future of [`RateLimitService`](super::RateLimitService).
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
        Checking {
            check: Check,
            inner: Option<(S, Request<B>)>,
            fail_closed: bool,
            limit: RateLimit,
        },
        Calling {
            #[pin]
            future: S::Future,
            headers: HeaderMap,
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
    pub(crate) fn checking(
        check: Check,
        inner: S,
        request: Request<B>,
        fail_closed: bool,
        limit: RateLimit,
    ) -> Self {
        Self {
            state: State::Checking {
                check,
                inner: Some((inner, request)),
                fail_closed,
                limit,
            },
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
                StateProj::Checking {
                    check,
                    inner,
                    fail_closed,
                    limit,
                } => {
                    let outcome = ready!(check.as_mut().poll(cx));
                    let Some((mut service, request)) = inner.take() else {
                        // Polled again after completion: nothing left to do.
                        return Poll::Pending;
                    };
                    let next = match outcome {
                        Ok(d) if d.allowed => State::Calling {
                            future: service.call(request),
                            headers: rate_headers(&d),
                        },
                        Ok(d) => State::Done {
                            response: Some(too_many(&d)),
                        },
                        // Only an unreachable Redis follows the fail-open setting: a
                        // refused key or setting must never switch the limit off.
                        Err(e) if !e.is_redis() => {
                            tracing::error!(error = %e, ?limit, "rate limit misconfigured");
                            State::Done {
                                response: Some(problem(
                                    StatusCode::INTERNAL_SERVER_ERROR,
                                    "rate-limit-misconfigured",
                                    "the server's rate-limit settings are wrong",
                                )),
                            }
                        }
                        Err(e) if *fail_closed => {
                            tracing::warn!(error = %e, "rate limit unavailable; failing closed");
                            State::Done {
                                response: Some(problem(
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "rate-limit-unavailable",
                                    "the rate limiter is unavailable; retry later",
                                )),
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, ?limit, "rate limit unavailable; failing open");
                            State::Calling {
                                future: service.call(request),
                                headers: HeaderMap::new(),
                            }
                        }
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future, headers } => {
                    let mut response = ready!(future.poll(cx))?;
                    response.headers_mut().extend(std::mem::take(headers));
                    return Poll::Ready(Ok(response));
                }
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

fn secs_ceil(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// The IETF `RateLimit-Policy` and `RateLimit` headers
/// (draft-ietf-httpapi-ratelimit-headers): quota `q` = the burst, window `w` = the time
/// to refill it; remaining `r`, and `t` = seconds until the quota is full again.
fn rate_headers(d: &Decision) -> HeaderMap {
    let limit = d.limit;
    let window = secs_ceil(limit.emission_interval() * limit.burst()).max(1);
    let mut h = HeaderMap::new();
    let policy = format!("\"default\";q={};w={window}", limit.burst());
    let state = format!(
        "\"default\";r={};t={}",
        d.remaining,
        secs_ceil(d.reset_after)
    );
    for (name, value) in [("ratelimit-policy", policy), ("ratelimit", state)] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(HeaderName::from_static(name), v);
        }
    }
    h
}

fn too_many<ResBody: From<String>>(d: &Decision) -> Response<ResBody> {
    let retry = secs_ceil(d.retry_after.unwrap_or_default()).max(1);
    let mut r = problem(
        StatusCode::TOO_MANY_REQUESTS,
        "rate-limited",
        &format!("too many requests; retry in {retry} s"),
    );
    r.headers_mut().extend(rate_headers(d));
    r.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(retry));
    r
}
