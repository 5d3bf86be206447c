//! The layers' services and futures, driven by hand on real Redis: a future polled
//! after completion panics with a clear message (instead of hanging), the layers answer
//! with their own body type (the inner body needs no `From<String>`), and the services
//! give their inner service back.

use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use lock_core::{LockClient, RateLimit};
use lock_tests::RedisServer;
use lock_tower::idempotency::IdempotencyLayer;
use lock_tower::one_time_token::OneTimeTokenLayer;
use lock_tower::rate_limit::{HeaderKey, RateLimitLayer};
use tower::{Layer, Service, ServiceExt, service_fn};

/// An inner service whose body type has no `From<String>` (nor `From<Bytes>`).
fn empty_ok() -> impl Service<
    Request<Empty<Bytes>>,
    Response = Response<Empty<Bytes>>,
    Error = Infallible,
    Future = impl Future + Send,
> + Clone {
    service_fn(|_: Request<Empty<Bytes>>| async { Ok(Response::new(Empty::new())) })
}

fn request(method: &str, headers: &[(&str, &str)]) -> Request<Empty<Bytes>> {
    let mut b = Request::builder().method(method).uri("/");
    for (name, value) in headers {
        b = b.header(*name, *value);
    }
    b.body(Empty::new()).unwrap()
}

/// Awaits `fut` to completion, then polls it once more: that must panic, saying why.
async fn assert_panics_when_polled_again<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let output = fut.as_mut().await;
    let again = std::panic::catch_unwind(AssertUnwindSafe(|| {
        fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
    }));
    let payload = match again {
        Ok(Poll::Pending) => panic!("polled after completion: Pending (a silent hang)"),
        Ok(Poll::Ready(_)) => panic!("polled after completion: Ready again"),
        Err(payload) => payload,
    };
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert_eq!(message, "`ResponseFuture` polled after completion");
    output
}

async fn client(server: &RedisServer) -> LockClient {
    LockClient::open(server.url().as_str()).await.unwrap()
}

async fn body_text<B: axum::body::HttpBody>(body: B) -> String
where
    B::Error: std::fmt::Debug,
{
    let bytes = body.collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_future_panics_when_polled_after_completion() {
    let server = RedisServer::start();
    let limiter = client(&server)
        .await
        .rate_limiter("futures", RateLimit::per_minute(1));
    let layer = RateLimitLayer::new(limiter, HeaderKey(HeaderName::from_static("x-user")));
    let mut svc = layer.layer(empty_ok());
    let user = [("x-user", "ann")];
    // Checked and passed, checked and refused, refused without a check.
    for (req, status) in [
        (request("GET", &user), StatusCode::OK),
        (request("GET", &user), StatusCode::TOO_MANY_REQUESTS),
        (request("GET", &[]), StatusCode::BAD_REQUEST),
    ] {
        let fut = svc.ready().await.unwrap().call(req);
        let response = assert_panics_when_polled_again(fut).await.unwrap();
        assert_eq!(response.status(), status);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_time_token_future_panics_when_polled_after_completion() {
    let server = RedisServer::start();
    let tokens = client(&server).await.one_time_tokens("futures");
    let token = tokens
        .issue("checkout", Duration::from_secs(60))
        .await
        .unwrap();
    let mut svc = OneTimeTokenLayer::new(tokens, "checkout").layer(empty_ok());
    let with_token = || request("POST", &[("one-time-token", token.as_str())]);
    // Unprotected, token used, token used again, no token.
    for (req, status) in [
        (request("GET", &[]), StatusCode::OK),
        (with_token(), StatusCode::OK),
        (with_token(), StatusCode::CONFLICT),
        (request("POST", &[]), StatusCode::BAD_REQUEST),
    ] {
        let fut = svc.ready().await.unwrap().call(req);
        let response = assert_panics_when_polled_again(fut).await.unwrap();
        assert_eq!(response.status(), status);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_future_panics_when_polled_after_completion() {
    let server = RedisServer::start();
    let store = client(&server).await.idempotency_store("futures");
    let inner = service_fn(|_: Request<http_body_util::Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(http_body_util::Full::new(Bytes::from(
            "made",
        ))))
    });
    let mut svc = IdempotencyLayer::new(store)
        .allow_anonymous(true)
        .layer(inner);
    let post = |key: Option<&str>| {
        let mut b = Request::post("/");
        if let Some(key) = key {
            b = b.header("idempotency-key", key);
        }
        b.body(http_body_util::Full::new(Bytes::new())).unwrap()
    };
    // Unprotected, run and stored, replayed, refused before any Redis call.
    for (req, status) in [
        (post(None), StatusCode::OK),
        (post(Some("k1")), StatusCode::OK),
        (post(Some("k1")), StatusCode::OK),
        (post(Some("a b")), StatusCode::BAD_REQUEST),
    ] {
        let fut = svc.ready().await.unwrap().call(req);
        let response = assert_panics_when_polled_again(fut).await.unwrap();
        assert_eq!(response.status(), status);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_and_token_layers_answer_with_their_own_body_type() {
    let server = RedisServer::start();
    let c = client(&server).await;
    let limiter = c.rate_limiter("bodies", RateLimit::per_minute(1));
    let limited = RateLimitLayer::new(limiter, HeaderKey(HeaderName::from_static("x-user")))
        .layer(empty_ok());
    let user = || request("GET", &[("x-user", "ann")]);
    let ok = limited.clone().oneshot(user()).await.unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(body_text(ok.into_body()).await, "");
    let refused = limited.oneshot(user()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body_text(refused.into_body())
            .await
            .contains("\"type\":\"rate-limited\"")
    );

    let tokens = c.one_time_tokens("bodies");
    let checked = OneTimeTokenLayer::new(tokens, "checkout").layer(empty_ok());
    let used = request("POST", &[("one-time-token", "never-issued")]);
    let refused = checked.oneshot(used).await.unwrap();
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert!(
        body_text(refused.into_body())
            .await
            .contains("\"type\":\"one-time-token-used\"")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_give_their_inner_service_back() {
    let server = RedisServer::start();
    let c = client(&server).await;
    #[derive(Clone, Debug, PartialEq)]
    struct Inner(u32);

    let limiter = c.rate_limiter("inner", RateLimit::per_minute(1));
    let mut svc =
        RateLimitLayer::new(limiter, HeaderKey(HeaderName::from_static("x-user"))).layer(Inner(1));
    svc.get_mut().0 += 1;
    assert_eq!(svc.get_ref(), &Inner(2));
    assert_eq!(svc.into_inner(), Inner(2));

    let mut svc = OneTimeTokenLayer::new(c.one_time_tokens("inner"), "s").layer(Inner(1));
    svc.get_mut().0 += 1;
    assert_eq!(svc.get_ref(), &Inner(2));
    assert_eq!(svc.into_inner(), Inner(2));

    let mut svc = IdempotencyLayer::new(c.idempotency_store("inner")).layer(Inner(1));
    svc.get_mut().0 += 1;
    assert_eq!(svc.get_ref(), &Inner(2));
    assert_eq!(svc.into_inner(), Inner(2));
}
