//! IdempotencyLayer in an axum Router (through `oneshot`) on real Redis: replays,
//! rejections, what is not stored, principals, Redis failures and retention.

use crate::common;
use crate::support as idem;

use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use common::eventually;
use http::{Method, Response, StatusCode};
use idem::{Backend, app, created, layer, lock_client, post_with, records, request, send};
use lock_core::{IdempotencyStore, LockError};
use lock_tests::RedisServer;
use lock_tower::idempotency::IdempotencyLayer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_completion_is_replayed_byte_for_byte() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(&backend, layer(&server).await);
    let first = post_with(&router, Some("\"order-1\""), "10 EUR").await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    assert_eq!(first.header("set-cookie"), "session=1");
    for _ in 0..2 {
        // Quoted (RFC 8941) or bare: the same key.
        let again = post_with(&router, Some("order-1"), "10 EUR").await;
        again.assert_replays(&first);
        assert_eq!(again.body, r#"{"run":1,"bytes":6}"#);
        assert_eq!(again.header("x-run"), "1");
        assert_eq!(
            again.header("set-cookie"),
            "",
            "denied headers are not replayed"
        );
    }
    assert_eq!(backend.runs(), 1);
    // Unprotected: GET, and a POST without a key (keys are optional by default).
    assert!(
        !send(&router, request(Method::GET, Some("order-1"), None, ""))
            .await
            .replayed()
    );
    assert!(!post_with(&router, None, "10 EUR").await.replayed());
    assert_eq!(backend.runs(), 3);
}

/// gRPC's way: the outcome in trailers after the body.
fn with_trailers(run: usize, _body: Bytes) -> Response<Body> {
    use hyper::body::Frame;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert("x-run-trailer", run.to_string().parse().unwrap());
    let frames = vec![
        Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"\0\0\0\0\x02ok"))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/grpc")
        .body(Body::new(http_body_util::StreamBody::new(
            futures_util::stream::iter(frames),
        )))
        .unwrap()
}

/// A response's trailers reach the first client and are replayed with the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_go_out_and_are_replayed() {
    use http_body_util::BodyExt;
    let server = RedisServer::start();
    let backend = Backend::new(with_trailers);
    let router = app(&backend, layer(&server).await);
    let mut answers = Vec::new();
    for _ in 0..2 {
        let request = request(Method::POST, Some("\"call-1\""), None, "");
        let response = tower::ServiceExt::oneshot(router.clone(), request)
            .await
            .unwrap();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let body = response.into_body().collect().await.unwrap();
        let trailers = body.trailers().cloned();
        answers.push((replayed, body.to_bytes(), trailers));
    }
    assert_eq!(backend.runs(), 1);
    for (i, (replayed, body, trailers)) in answers.into_iter().enumerate() {
        assert_eq!(replayed, i == 1);
        assert_eq!(&body[..], b"\0\0\0\0\x02ok", "answer {i}");
        let trailers = trailers.unwrap_or_else(|| panic!("answer {i} has no trailers"));
        assert_eq!(trailers["grpc-status"], "0", "answer {i}");
        assert_eq!(trailers["x-run-trailer"], "1", "answer {i}");
    }
}

/// The handler of a claimed request, which runs in a task of its own, runs in the span
/// the request was called in (a `TraceLayer`'s request span).
#[tokio::test]
async fn the_handler_runs_in_the_span_of_its_request() {
    use std::sync::{Arc, Mutex};
    use tracing::Instrument;
    // One thread: the spawned handler sees this thread's subscriber.
    let _subscriber = tracing::subscriber::set_default(tracing_subscriber::registry());
    let server = RedisServer::start();
    let seen = Arc::new(Mutex::new(None));
    let handler_saw = seen.clone();
    let router = axum::Router::new()
        .route(
            "/pay",
            axum::routing::post(move || {
                let seen = handler_saw.clone();
                async move {
                    let span = tracing::Span::current();
                    *seen.lock().unwrap() = span.metadata().map(|m| m.name());
                    "paid"
                }
            }),
        )
        .layer(layer(&server).await);
    let request = request(Method::POST, Some("\"span-1\""), None, "");
    let response = tower::ServiceExt::oneshot(router, request)
        .instrument(tracing::info_span!("the-request"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*seen.lock().unwrap(), Some("the-request"));
}

/// A random version-4 UUID, lowercase, whose first hex digit is `first`.
fn uuid(rng: &mut fastrand::Rng, first: u8) -> String {
    let mut bytes: [u8; 16] = std::array::from_fn(|_| rng.u8(..));
    bytes[0] = (first << 4) | (bytes[0] & 0x0f);
    bytes[6] = 0x40 | (bytes[6] & 0x0f);
    bytes[8] = 0x80 | (bytes[8] & 0x3f);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// Reproduce a failure with `KEY_SEED=<seed>`; the seed is printed at every run.
fn key_seed() -> u64 {
    let seed = std::env::var("KEY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("KEY_SEED={seed}");
    seed
}

/// Stripe's clients send bare UUIDs: every one is a key, whatever its first digit, and
/// its quoted form is the same key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_uuids_are_keys_bare_or_quoted_and_both_forms_are_one_key() {
    let seed = key_seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(&backend, layer(&server).await);
    // Every leading hex digit, four times, each time starting with either form.
    let uuids: Vec<String> = (0..64).map(|i| uuid(&mut rng, i % 16)).collect();
    for (i, id) in uuids.iter().enumerate() {
        let quoted = format!("\"{id}\"");
        let (first, second) = if rng.bool() {
            (id.as_str(), quoted.as_str())
        } else {
            (quoted.as_str(), id.as_str())
        };
        let original = post_with(&router, Some(first), "a").await;
        assert_eq!(
            (original.status, original.replayed()),
            (StatusCode::CREATED, false),
            "KEY_SEED={seed}: key {first} -> {original:?}"
        );
        let again = post_with(&router, Some(second), "a").await;
        assert!(
            again.replayed(),
            "KEY_SEED={seed}: {second} is not the key {first}: {again:?}"
        );
        again.assert_replays(&original);
        assert_eq!(backend.runs(), i + 1, "KEY_SEED={seed}: {id}");
    }
    assert_eq!(records(&server).await.len(), uuids.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_payloads_and_bodies_are_rejected() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(
        &backend,
        layer(&server).await.require_key(true).max_body_bytes(16),
    );
    let problem = |r: &idem::Reply, status: u16| {
        assert_eq!(r.status, status, "{r:?}");
        assert_eq!(r.header("content-type"), "application/problem+json");
    };
    assert_eq!(post_with(&router, Some("k"), "a").await.status, 201);
    // Same key, different payload.
    problem(&post_with(&router, Some("k"), "b").await, 422);
    // Missing, malformed and over-long keys.
    problem(&post_with(&router, None, "a").await, 400);
    for bad in ["\"unterminated", "a b", "a;p=1", "\"\"", "?1", "(a b)"] {
        problem(&post_with(&router, Some(bad), "a").await, 400);
    }
    let long = "k".repeat(256);
    let r = post_with(&router, Some(&long), "a").await;
    problem(&r, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("256 characters"),
        "{r:?}"
    );
    assert_eq!(
        post_with(&router, Some(&long[..255]), "a").await.status,
        201
    );
    // A body over the limit.
    problem(&post_with(&router, Some("big"), &"x".repeat(17)).await, 413);
    assert_eq!(
        post_with(&router, Some("fits"), &"x".repeat(16))
            .await
            .status,
        201
    );
    // Keys are not needed where nothing is protected.
    assert_eq!(
        send(&router, request(Method::GET, None, None, ""))
            .await
            .status,
        201
    );
    assert_eq!(backend.runs(), 4);
    assert!(records(&server).await.len() == 3);
}

fn fails_once(run: usize, body: Bytes) -> Response<Body> {
    if run == 1 {
        let mut r = Response::new(Body::from("try again"));
        *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
        return r;
    }
    created(run, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_not_stored_unless_asked() {
    let server = RedisServer::start();
    let backend = Backend::new(fails_once);
    let router = app(&backend, layer(&server).await);
    assert_eq!(post_with(&router, Some("k"), "a").await.status, 500);
    assert!(records(&server).await.is_empty(), "the key was not freed");
    let second = post_with(&router, Some("k"), "a").await;
    assert_eq!(
        (second.status, second.replayed()),
        (StatusCode::CREATED, false)
    );
    post_with(&router, Some("k"), "a")
        .await
        .assert_replays(&second);
    assert_eq!(backend.runs(), 2);

    let backend = Backend::new(fails_once);
    let router = app(&backend, layer(&server).await.store_server_errors(true));
    let first = post_with(&router, Some("k2"), "a").await;
    assert_eq!(first.status, 500);
    post_with(&router, Some("k2"), "a")
        .await
        .assert_replays(&first);
    assert_eq!(backend.runs(), 1);
}

fn panics_once(run: usize, body: Bytes) -> Response<Body> {
    assert!(run > 1, "the handler panics on its first run (on purpose)");
    created(run, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_frees_the_key() {
    let server = RedisServer::start();
    let backend = Backend::new(panics_once);
    let router = app(&backend, layer(&server).await);
    let call = tokio::spawn({
        let router = router.clone();
        async move { post_with(&router, Some("k"), "a").await }
    });
    assert!(call.await.unwrap_err().is_panic());
    eventually(Duration::from_secs(5), "the key to be freed", || async {
        records(&server).await.is_empty()
    })
    .await;
    let retry = post_with(&router, Some("k"), "a").await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(backend.runs(), 2);
}

fn large(run: usize, _: Bytes) -> Response<Body> {
    Response::new(Body::from(format!("{run}:{}", "x".repeat(200))))
}

/// The same size, of unknown length (streamed): read up to the limit, then streamed
/// through, not stored.
fn large_stream(run: usize, _: Bytes) -> Response<Body> {
    let chunks = (0..20).map(move |i| Ok::<_, std::io::Error>(format!("{run}:{i:07}\n")));
    Response::new(Body::from_stream(futures_util::stream::iter(chunks)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_over_the_storable_limit_pass_through_unstored() {
    let server = RedisServer::start();
    for respond in [large as idem::Respond, large_stream] {
        let backend = Backend::new(respond);
        let router = app(&backend, layer(&server).await.max_stored_bytes(100));
        for run in 1..=2 {
            let r = post_with(&router, Some("big"), "a").await;
            assert_eq!((r.status, r.replayed()), (StatusCode::OK, false));
            assert!(r.body.len() > 100, "the whole response goes out");
            assert!(
                r.body.starts_with(format!("{run}:").as_bytes()),
                "a retry runs again"
            );
        }
        assert!(records(&server).await.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_principals_with_one_key_never_see_each_other() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(&backend, layer(&server).await);
    let as_user = |auth: &str| request(Method::POST, Some("shared-key"), Some(auth), "a");
    let alice = send(&router, as_user("Bearer alice")).await;
    let bob = send(&router, as_user("Bearer bob")).await;
    assert_eq!((alice.replayed(), bob.replayed()), (false, false));
    assert_eq!((alice.header("x-run"), bob.header("x-run")), ("1", "2"));
    send(&router, as_user("Bearer alice"))
        .await
        .assert_replays(&alice);
    send(&router, as_user("Bearer bob"))
        .await
        .assert_replays(&bob);
    // Anonymous is a third scope.
    assert_eq!(
        post_with(&router, Some("shared-key"), "a")
            .await
            .header("x-run"),
        "3"
    );
    let stored = records(&server).await.join(" ");
    assert!(
        !stored.contains("alice"),
        "credentials leak into keys: {stored}"
    );

    // Pluggable: the key from a closure, the principal from a tenant header.
    let backend = Backend::new(created);
    let by_request_id =
        |r: &http::Request<Body>| Some(r.headers().get("x-request-id")?.to_str().ok()?.to_owned());
    let by_tenant =
        |r: &http::Request<Body>| Some(r.headers().get("x-tenant")?.to_str().ok()?.to_owned());
    let custom = IdempotencyLayer::new(lock_client(&server).await.idempotency_store("custom"))
        .key_extractor(by_request_id)
        .principal(by_tenant);
    let router = app(&backend, custom);
    let tenant = |t: &str| {
        http::Request::post("/pay")
            .header("x-request-id", "r-1")
            .header("x-tenant", t)
            .body(Body::from("a"))
            .unwrap()
    };
    let acme = send(&router, tenant("acme")).await;
    send(&router, tenant("acme")).await.assert_replays(&acme);
    assert!(!send(&router, tenant("globex")).await.replayed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_or_open_and_protection_resumes() {
    let mut server = RedisServer::start();
    let backend = Backend::new(created);
    let closed = app(&backend, layer(&server).await);
    let open = app(&backend, layer(&server).await.fail_closed(false));
    assert_eq!(post_with(&closed, Some("before"), "a").await.status, 201);

    server.kill();
    let r = post_with(&closed, Some("k"), "a").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "fail closed");
    assert_eq!(r.header("content-type"), "application/problem+json");
    assert_eq!(backend.runs(), 1, "fail closed must not run the handler");
    for expected_run in ["2", "3"] {
        // Fail open: the handler runs each time, unprotected.
        let r = post_with(&open, Some("k"), "a").await;
        assert_eq!(
            (r.status, r.header("x-run")),
            (StatusCode::CREATED, expected_run)
        );
    }

    server.restart();
    // The connection manager reconnects by itself; until then requests get 503.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        let r = post_with(&closed, Some("after"), "a").await;
        if r.status == StatusCode::CREATED {
            break r;
        }
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(Instant::now() < deadline, "protection did not resume");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    post_with(&closed, Some("after"), "a")
        .await
        .assert_replays(&first);
    post_with(&open, Some("after"), "a")
        .await
        .assert_replays(&first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_retention_window_the_key_is_new() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(
        &backend,
        layer(&server)
            .await
            .retention(Duration::from_millis(300))
            .unwrap(),
    );
    let first = post_with(&router, Some("k"), "a").await;
    post_with(&router, Some("k"), "a")
        .await
        .assert_replays(&first);
    eventually(Duration::from_secs(5), "the record to expire", || async {
        records(&server).await.is_empty()
    })
    .await;
    let again = post_with(&router, Some("k"), "a").await;
    assert_eq!((again.replayed(), again.header("x-run")), (false, "2"));
}

/// A retention the store cannot keep is refused when the layer is configured, so no
/// request ever meets it; the bounds it accepts are stored (never a 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retention_out_of_range_is_refused_when_configured() {
    let server = RedisServer::start();
    let max = IdempotencyStore::MAX_RETENTION;
    let out_of_range = [
        Duration::ZERO,
        Duration::from_micros(999),
        max + Duration::from_millis(1),
    ];
    for bad in out_of_range {
        let e = layer(&server).await.retention(bad).unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
        let said = e.to_string();
        assert!(
            said.contains(&format!("retention {bad:?} is outside 1ms..={max:?}")),
            "{said}"
        );
    }
    let backend = Backend::new(created);
    let router = app(&backend, layer(&server).await.retention(max).unwrap());
    let first = post_with(&router, Some("kept"), "a").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    post_with(&router, Some("kept"), "a")
        .await
        .assert_replays(&first);
    for (key, shortest) in [
        ("1ms", Duration::from_millis(1)),
        ("1.5ms", Duration::from_micros(1500)),
    ] {
        let router = app(&backend, layer(&server).await.retention(shortest).unwrap());
        let r = post_with(&router, Some(key), "a").await;
        assert_eq!(
            (r.status, r.replayed()),
            (StatusCode::CREATED, false),
            "{key}: {r:?}"
        );
        eventually(Duration::from_secs(5), "the record to expire", || async {
            records(&server).await.len() == 1
        })
        .await;
        let again = post_with(&router, Some(key), "a").await;
        assert_eq!(
            (again.status, again.replayed()),
            (StatusCode::CREATED, false),
            "{key}: {again:?}"
        );
    }
    assert_eq!(backend.runs(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_can_wait_for_the_first_and_replay_it() {
    let server = RedisServer::start();
    let backend = Backend::gated(1, created);
    let router = app(
        &backend,
        layer(&server).await.wait_in_flight(Duration::from_secs(10)),
    );
    let calls: Vec<_> = (0..20)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { post_with(&router, Some("k"), "a").await })
        })
        .collect();
    backend.entered(1).await;
    // Every duplicate is waiting on the key's channel before the first one finishes.
    let conn = server.connection().await;
    eventually(Duration::from_secs(5), "the duplicates to wait", || {
        let mut conn = conn.clone();
        async move {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg("*idempotency-done")
                .query_async(&mut conn)
                .await
                .unwrap();
            !channels.is_empty()
        }
    })
    .await;
    backend.open();
    let mut replies = Vec::new();
    for c in calls {
        replies.push(c.await.unwrap());
    }
    let (originals, replays): (Vec<_>, Vec<_>) = replies.into_iter().partition(|r| !r.replayed());
    assert_eq!(originals.len(), 1, "{originals:?}");
    assert_eq!(replays.len(), 19);
    for r in &replays {
        r.assert_replays(&originals[0]);
    }
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_the_lease_keeps_its_key() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(150);
    let backend = Backend::gated(1, created);
    let router = app(
        &backend,
        layer(&server).await.in_flight_lease(lease).unwrap(),
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_with(&router, Some("slow"), "a").await }
    });
    backend.entered(1).await;
    // The scenario itself is time: the handler outlives several leases.
    tokio::time::sleep(lease * 5).await;
    let duplicate = post_with(&router, Some("slow"), "a").await;
    assert_eq!(
        duplicate.status,
        StatusCode::CONFLICT,
        "the lease lapsed mid-handler"
    );
    backend.open();
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    post_with(&router, Some("slow"), "a")
        .await
        .assert_replays(&first);
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_lease_out_of_range_is_refused_when_configured() {
    let server = RedisServer::start();
    let (min, max) = (lock_core::MIN_LEASE, lock_core::MAX_LEASE);
    for bad in [
        Duration::ZERO,
        min - Duration::from_millis(1),
        max + Duration::from_millis(1),
    ] {
        let e = layer(&server).await.in_flight_lease(bad).unwrap_err();
        assert!(matches!(e, LockError::InvalidConfig(_)), "{e:?}");
        assert!(
            e.to_string().contains(&format!("lease {bad:?} is outside")),
            "{e}"
        );
    }
    // The bounds themselves serve requests.
    let backend = Backend::new(created);
    for (key, lease) in [("min", min), ("max", max)] {
        let router = app(
            &backend,
            layer(&server).await.in_flight_lease(lease).unwrap(),
        );
        let r = post_with(&router, Some(key), "a").await;
        assert_eq!(r.status, StatusCode::CREATED, "{key}: {r:?}");
    }
}

/// A handler that does not finish, whose client went away: within the detached limit
/// its key stays claimed (a retry is told 409); past it the handler is stopped and
/// the key freed, so a retry runs again instead of being refused for as long as the
/// abandoned task would have renewed its claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_left_alone_past_the_detached_limit_is_stopped_and_frees_its_key() {
    let server = RedisServer::start();
    let backend = Backend::gated(1, created);
    let lease = Duration::from_millis(200);
    let limit = Duration::from_millis(600);
    let router = app(
        &backend,
        layer(&server)
            .await
            .in_flight_lease(lease)
            .unwrap()
            .detached_limit(limit),
    );
    let first = tokio::spawn({
        let router = router.clone();
        async move { post_with(&router, Some("hangs"), "a").await }
    });
    backend.entered(1).await;
    // The client goes away; the handler waits at its gate (30 s).
    first.abort();
    let _ = first.await;
    let left = Instant::now();
    assert_eq!(
        post_with(&router, Some("hangs"), "a").await.status,
        StatusCode::CONFLICT,
        "the key is still claimed right after the client left"
    );
    eventually(
        Duration::from_secs(10),
        "a retry that runs again",
        || async { post_with(&router, Some("hangs"), "a").await.status == StatusCode::CREATED },
    )
    .await;
    assert!(left.elapsed() >= limit, "freed before the limit");
    assert_eq!(backend.runs(), 2);
    let replay = post_with(&router, Some("hangs"), "a").await;
    assert!(replay.replayed());
    assert_eq!(replay.header("x-run"), "2");
}
