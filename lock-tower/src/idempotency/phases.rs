//! The two Redis-facing phases of a protected request: before the handler (buffer,
//! fingerprint, claim), a boxed future the response future drives; and the handler
//! with what follows it (read the response, store it or free the key), which the
//! response future spawns as a task of its own ([`complete`]).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Context;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, RETRY_AFTER};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};

use lock_core::{Begin, Claim, LockError};

use super::record;
use super::scope::{Scope, fingerprint};
use super::settings::Settings;
use crate::ResponseBody;
use crate::body::BoxError;
use crate::problem::problem;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What to do once the key was looked up.
// Moved once per request into the next state: boxing the request would only add an
// allocation.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Prepared<B, R> {
    /// Call the handler; with a claim to complete, or none (failing open).
    Run {
        request: Request<B>,
        claim: Option<Claim>,
    },
    /// Answer without the handler: a rejection or a replay.
    Respond(R),
}

/// A claim while its handler runs: renewed by polling the claim's `keep_alive` (its one
/// renewal mechanism) whenever the response future waits. The renewal timer is only
/// made once the handler or its body is not ready at once.
pub(crate) struct Running {
    claim: Claim,
    keep_alive: Option<BoxFuture<()>>,
    lost: bool,
    settings: Arc<Settings>,
}

impl Running {
    pub(crate) fn new(claim: Claim, settings: Arc<Settings>) -> Self {
        Self {
            claim,
            keep_alive: None,
            lost: false,
            settings,
        }
    }

    /// Drives the renewal timer while the caller is about to wait; it resolves only when
    /// the claim is lost (logged by the claim).
    pub(crate) fn poll_keep_alive(&mut self, cx: &mut Context<'_>) {
        if self.lost {
            return;
        }
        let claim = &self.claim;
        let keep_alive = self
            .keep_alive
            .get_or_insert_with(|| Box::pin(claim.keep_alive()));
        if keep_alive.as_mut().poll(cx).is_ready() {
            self.keep_alive = None;
            self.lost = true;
        }
    }
}

/// Buffers the body (413 over the limit), fingerprints the request and claims the key.
pub(crate) async fn prepare<B, R>(
    settings: Arc<Settings>,
    scope: Scope,
    request: Request<B>,
) -> Prepared<B, Response<ResponseBody<R>>>
where
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let limit = settings.max_body_bytes;
    let too_large = || {
        Prepared::Respond(problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request-body-too-large",
            &format!("the request body is larger than {limit} bytes"),
        ))
    };
    if body.size_hint().lower() > limit as u64 {
        return too_large();
    }
    let bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => return too_large(),
        Err(e) => {
            tracing::debug!(error = %e, "request body unreadable");
            return Prepared::Respond(problem(
                StatusCode::BAD_REQUEST,
                "request-body-unreadable",
                "the request body could not be read",
            ));
        }
    };
    let fp = fingerprint(&parts, &bytes);
    let request = Request::from_parts(parts, B::from(bytes));
    let s = &settings;
    let mut found = s.store.begin_or_wait(&scope, &fp, s.lease, s.wait).await;
    if let Err(LockError::InvalidKey(_)) = &found {
        // Too long once escaped (a long principal, a key of many `:`): kept under the
        // hash of its parts instead.
        found = s
            .store
            .begin_or_wait(scope.hashed(), &fp, s.lease, s.wait)
            .await;
    }
    let respond = |status, kind, detail: &str| Prepared::Respond(problem(status, kind, detail));
    match found {
        Ok(Begin::New(claim)) => Prepared::Run {
            request,
            claim: Some(claim),
        },
        Ok(Begin::InFlight { .. }) => {
            let mut r = problem(
                StatusCode::CONFLICT,
                "idempotency-key-in-use",
                "a request with this idempotency key is still being processed; retry later",
            );
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            Prepared::Respond(r)
        }
        Ok(Begin::Completed(stored)) => Prepared::Respond(replay(stored)),
        Ok(Begin::Mismatch) => respond(
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency-key-reused",
            "this idempotency key was already used for a different request",
        ),
        Err(e) if e.is_redis() && !s.fail_closed => {
            tracing::warn!(error = %e, "idempotency store unavailable; failing open");
            Prepared::Run {
                request,
                claim: None,
            }
        }
        Err(e) if e.is_redis() => {
            tracing::warn!(error = %e, "idempotency store unavailable; failing closed");
            let mut r = problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "idempotency-unavailable",
                "idempotency keys cannot be checked right now; retry later",
            );
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            Prepared::Respond(r)
        }
        Err(LockError::InvalidKey(why)) => respond(
            StatusCode::BAD_REQUEST,
            "idempotency-key-invalid",
            &format!("the idempotency key cannot be stored: {why}"),
        ),
        Err(e) => misconfigured(&e),
        Ok(_) => misconfigured(&"an unknown begin outcome"),
    }
}

fn misconfigured<R: From<Bytes>, B>(why: &dyn std::fmt::Display) -> Prepared<B, Response<R>> {
    tracing::error!(error = %why, "idempotency layer misconfigured");
    Prepared::Respond(problem(
        StatusCode::INTERNAL_SERVER_ERROR,
        "idempotency-misconfigured",
        "the server's idempotency settings are wrong",
    ))
}

/// The stored response, marked `Idempotent-Replayed: true`.
fn replay<R>(stored: Vec<u8>) -> Response<ResponseBody<R>> {
    let Some(stored) = record::decode(stored) else {
        tracing::error!("stored idempotent response is not a record this layer wrote");
        return problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "idempotency-record-unreadable",
            "the stored response for this idempotency key cannot be read",
        );
    };
    let mut response = Response::new(ResponseBody::with_trailers(stored.body, stored.trailers));
    *response.status_mut() = stored.status;
    *response.headers_mut() = stored.headers;
    response.headers_mut().insert(
        HeaderName::from_static("idempotent-replayed"),
        HeaderValue::from_static("true"),
    );
    response
}

/// Runs the handler's `future` with its claim renewed, then stores its response (or
/// frees the key) and returns it. A service error or a panic drops `running`: the claim
/// frees the key.
pub(crate) async fn complete<F, R, E>(
    future: F,
    mut running: Running,
) -> Result<Response<ResponseBody<R>>, E>
where
    F: Future<Output = Result<Response<R>, E>>,
    R: Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let mut future = std::pin::pin!(future);
    let response = poll_fn(|cx| {
        let polled = future.as_mut().poll(cx);
        if polled.is_pending() {
            running.poll_keep_alive(cx);
        }
        polled
    })
    .await?;
    Ok(finish(response, running).await)
}

/// Stores the handler's response (or frees the key) and returns it to the client.
///
/// Reads at most `max_stored_bytes` (plus one frame) of the body: a body that ends
/// within the limit is stored, one that goes past it frees the key and goes out as
/// what was read followed by the rest, streamed.
async fn finish<R>(response: Response<R>, mut running: Running) -> Response<ResponseBody<R>>
where
    R: Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    let settings = running.settings.clone();
    let key = running.claim.key().to_owned();
    if let Some(why) = not_stored(&settings, &response) {
        free(running.claim, why).await;
        return response.map(ResponseBody::inner);
    }
    let limit = settings.max_stored_bytes;
    if response.body().size_hint().lower() > limit as u64 {
        // Known to be too large: stream it through untouched.
        tracing::warn!(key = %key, limit, "response larger than the storable limit; passed through, not stored, key freed");
        free(running.claim, "response too large").await;
        return response.map(ResponseBody::inner);
    }
    let (parts, body) = response.into_parts();
    let mut body = Box::pin(body);
    let mut read = BytesMut::new();
    let mut trailers: Option<http::HeaderMap> = None;
    let ended = loop {
        if read.len() > limit {
            break false;
        }
        let frame = poll_fn(|cx| {
            let polled = body.as_mut().poll_frame(cx);
            if polled.is_pending() {
                running.poll_keep_alive(cx);
            }
            polled
        })
        .await
        .map(|f| f.map_err(Into::<BoxError>::into));
        match frame {
            None => break true,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => read.extend_from_slice(&data),
                Err(frame) => {
                    if let Ok(more) = frame.into_trailers() {
                        trailers.get_or_insert_default().extend(more);
                    }
                }
            },
            Some(Err(e)) => {
                tracing::warn!(key = %key, error = %e, "response body failed; key freed");
                free(running.claim, "response body failed").await;
                return problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "response-body-failed",
                    "the response could not be produced",
                );
            }
        }
    };
    let read = read.freeze();
    if !ended {
        tracing::warn!(key = %key, limit, "response larger than the storable limit; streamed through, not stored, key freed");
        free(running.claim, "response too large").await;
        return Response::from_parts(parts, ResponseBody::resumed(read, body));
    }
    let record = record::encode(&parts, &read, trailers.as_ref(), &settings.deny_headers);
    if let Err(e) = running.claim.complete(&record, settings.retention).await {
        tracing::warn!(key = %key, error = %e, "response not stored; a retry will run again");
    }
    Response::from_parts(parts, ResponseBody::with_trailers(read, trailers))
}

/// Why a response is not stored, judged by its head alone.
fn not_stored<R>(settings: &Settings, response: &Response<R>) -> Option<&'static str> {
    let status = response.status();
    // On a refusal `Retry-After` asks the client to try again; on a success (202 and a
    // job to poll) or a redirect it only says when to follow up on what was done.
    let refused = status.is_client_error() || status.is_server_error();
    if refused && response.headers().contains_key(RETRY_AFTER) {
        Some("a refusal asking for a retry is not stored")
    } else if status.is_server_error() {
        (!settings.store_server_errors).then_some("a server error is not stored")
    } else {
        (!(settings.store_status)(status)).then_some("the status is not stored")
    }
}

/// Frees the key before the response goes out, so a retry that follows runs again.
async fn free(claim: Claim, why: &str) {
    let key = claim.key().to_owned();
    match claim.abandon().await {
        Ok(()) => tracing::debug!(key = %key, reason = why, "idempotency key freed"),
        Err(e) => {
            tracing::warn!(key = %key, reason = why, error = %e, "idempotency key not freed; its lease will free it")
        }
    }
}
