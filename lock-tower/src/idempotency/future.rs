use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::Service;
use tracing::Instrument;

use super::phases::{BoxFuture, Prepared, Running, complete, prepare};
use super::scope::Scope;
use super::settings::Settings;
use crate::ResponseBody;
use crate::body::BoxError;
use crate::check::polled_after_completion;
use crate::problem::problem;

pin_project! {
    /// Response future of [`IdempotencyService`](super::IdempotencyService).
    ///
    /// Once a key is claimed, the handler and the storing of its response run in a task
    /// of their own: dropped before it completes (the client went away), this future
    /// leaves them to finish, so the response is stored and a retry replays it instead
    /// of running a handler that may have done part of its work. A panicking handler
    /// frees the claimed key, and its panic is resumed here. The task runs in the span
    /// current when the handler is called (a `TraceLayer`'s request span), but not
    /// with the caller's task-locals. With no Tokio runtime to spawn on, they run in
    /// this future, and dropping it frees the key.
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
        // Unprotected: the handler runs.
        Calling {
            #[pin]
            future: S::Future,
        },
        // Protected: the handler runs and its response is stored (or the key freed), in
        // a task of its own.
        Spawned {
            task: tokio::task::JoinHandle<Result<Response<ResponseBody<R>>, S::Error>>,
            // Dropped with this future: the task is on its own from then on.
            attached: tokio::sync::oneshot::Sender<()>,
        },
        // The same, here: no runtime to spawn on.
        Completing {
            complete: BoxFuture<Result<Response<ResponseBody<R>>, S::Error>>,
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
            state: State::Calling { future },
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
    S::Future: Send + 'static,
    S::Error: Send + 'static,
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
                        Prepared::Run { request, claim } => {
                            // `inner` is only taken here, on leaving `Preparing`.
                            let Some(mut service) = inner.take() else {
                                unreachable!("an idempotent request ran twice")
                            };
                            let future = service.call(request);
                            match claim {
                                None => State::Calling { future },
                                Some(claim) => {
                                    let running = Running::new(claim, settings.clone());
                                    // In the request's span (a `TraceLayer`'s), as if it ran here.
                                    let job = complete(future, running);
                                    let span = tracing::Span::current();
                                    match tokio::runtime::Handle::try_current() {
                                        Ok(rt) => {
                                            let (attached, detached) =
                                                tokio::sync::oneshot::channel();
                                            let limit = settings.detached_limit;
                                            let job = within_once_detached(job, detached, limit);
                                            State::Spawned {
                                                task: rt.spawn(job.instrument(span)),
                                                attached,
                                            }
                                        }
                                        Err(_) => State::Completing {
                                            complete: Box::pin(job.instrument(span)),
                                        },
                                    }
                                }
                            }
                        }
                    };
                    this.state.set(next);
                }
                StateProj::Calling { future } => {
                    let response = ready!(future.poll(cx));
                    this.state.set(State::Done { response: None });
                    return Poll::Ready(response.map(|r| r.map(ResponseBody::inner)));
                }
                StateProj::Spawned { task, .. } => {
                    let joined = ready!(Pin::new(task).poll(cx));
                    this.state.set(State::Done { response: None });
                    return Poll::Ready(match joined {
                        Ok(answer) => answer,
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        // The runtime shuts down: the claim went with the task.
                        Err(_) => Ok(problem(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "server-shutting-down",
                            "the server shut down before the request completed; retry it",
                        )),
                    });
                }
                StateProj::Completing { complete } => {
                    let answer = ready!(complete.as_mut().poll(cx));
                    this.state.set(State::Done { response: None });
                    return Poll::Ready(answer);
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

/// Runs `job`; once `detached` says its response future is gone, for at most `limit`
/// more. Stopped there, the job's claim goes with it and frees the key.
async fn within_once_detached<T, E>(
    job: impl Future<Output = Result<Response<ResponseBody<T>>, E>>,
    detached: tokio::sync::oneshot::Receiver<()>,
    limit: std::time::Duration,
) -> Result<Response<ResponseBody<T>>, E> {
    let alone_too_long = async {
        // Only ever closed: nothing is sent on it.
        let _ = detached.await;
        tokio::time::sleep(limit).await;
    };
    tokio::select! {
        biased;
        answer = job => answer,
        () = alone_too_long => {
            tracing::warn!(
                ?limit,
                "idempotency: a handler whose client went away ran past the detached limit: \
                 stopped, and its key freed (a retry runs it again)"
            );
            // Nobody awaits this answer.
            Ok(problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "handler-stopped",
                "the request ran too long after its client went away",
            ))
        }
    }
}
