//! IdempotencyLayer policy on real Redis: which responses are stored, which
//! headers are replayed, whose key it is, and what a key is.

use crate::support as idem;

use axum::body::Body;
use bytes::Bytes;
use http::{Response, StatusCode};
use idem::{Backend, app, created, layer, post_with, records};
use lock_tests::RedisServer;

/// Run 1 answers `status` (with `Retry-After` when asked), later runs 201.
fn refusal(run: usize, body: Bytes, status: u16, retry_after: bool) -> Response<Body> {
    if run > 1 {
        return created(run, body);
    }
    let mut b = Response::builder().status(status);
    if retry_after {
        b = b.header("retry-after", "1");
    }
    b.body(Body::from("not now")).unwrap()
}

fn busy(run: usize, body: Bytes) -> Response<Body> {
    refusal(run, body, 409, true)
}
fn not_yet(run: usize, body: Bytes) -> Response<Body> {
    refusal(run, body, 403, true)
}
fn too_many(run: usize, body: Bytes) -> Response<Body> {
    refusal(run, body, 429, false)
}
fn not_found(run: usize, body: Bytes) -> Response<Body> {
    refusal(run, body, 404, false)
}

/// A refusal that tells the client to retry is not stored: replayed, the retry would get
/// the refusal again after the condition passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_asking_for_a_retry_are_not_stored() {
    let server = RedisServer::start();
    for (respond, status) in [
        (busy as idem::Respond, 409),
        (not_yet, 403),
        (too_many, 429),
    ] {
        let backend = Backend::new(respond);
        let router = app(&backend, layer(&server).await);
        assert_eq!(post_with(&router, Some("k"), "a").await.status, status);
        assert!(records(&server).await.is_empty(), "{status}: key not freed");
        let retry = post_with(&router, Some("k"), "a").await;
        assert_eq!(
            (retry.status, retry.replayed()),
            (StatusCode::CREATED, false),
            "the retry after a {status} runs again"
        );
        assert_eq!(backend.runs(), 2);
        // A flushed store for the next case.
        let mut c = server.connection().await;
        let () = redis::cmd("FLUSHALL").query_async(&mut c).await.unwrap();
    }
}

/// 202 with `Location` and `Retry-After`: a job was started, and the header says when
/// to poll it. The answer is stored like any success, so a retry starts no second job.
fn accepted(run: usize, _body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::ACCEPTED)
        .header("location", format!("/jobs/{run}"))
        .header("retry-after", "5")
        .body(Body::from(format!("job {run}")))
        .unwrap()
}

/// `Retry-After` keeps only a refusal (4xx, 5xx) from being stored: on a success or a
/// redirect it tells the client when to follow up on what was done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_asking_to_come_back_later_is_stored() {
    let server = RedisServer::start();
    let backend = Backend::new(accepted);
    let router = app(&backend, layer(&server).await);
    let first = post_with(&router, Some("k"), "a").await;
    assert_eq!(first.status, StatusCode::ACCEPTED);
    let retry = post_with(&router, Some("k"), "a").await;
    retry.assert_replays(&first);
    assert_eq!(retry.header("location"), "/jobs/1");
    assert_eq!(backend.runs(), 1, "the retry started a second job");
}

/// A key whose stored name would be too long once escaped (a long principal, such as a
/// raw token, and a key of 255 `:`, which escape to three bytes each) is kept under the
/// hash of its parts: replayed to its owner, and to nobody else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_too_long_to_store_literally_is_kept_under_its_hash() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let by_header =
        |r: &http::Request<Body>| Some(r.headers().get("authorization")?.to_str().ok()?.to_owned());
    let router = app(&backend, layer(&server).await.principal(by_header));
    let key = ":".repeat(255);
    let (alice, bob) = ("a".repeat(700), "b".repeat(700));
    let as_user = |who: &str| idem::request(http::Method::POST, Some(&key), Some(who), "a");
    let first = idem::send(&router, as_user(&alice)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    idem::send(&router, as_user(&alice))
        .await
        .assert_replays(&first);
    assert_eq!(backend.runs(), 1);
    let other = idem::send(&router, as_user(&bob)).await;
    assert_eq!(
        (other.status, other.replayed()),
        (StatusCode::CREATED, false)
    );
    assert_eq!(backend.runs(), 2);
    assert_eq!(records(&server).await.len(), 2);
}

/// Which statuses are stored is a setting; by default a plain 404 is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_statuses_are_configurable() {
    let server = RedisServer::start();
    let backend = Backend::new(not_found);
    let router = app(&backend, layer(&server).await);
    let first = post_with(&router, Some("k1"), "a").await;
    assert_eq!(first.status, 404);
    post_with(&router, Some("k1"), "a")
        .await
        .assert_replays(&first);

    let backend = Backend::new(not_found);
    let only_success = layer(&server).await.store_status(|s| s.is_success());
    let router = app(&backend, only_success);
    assert_eq!(post_with(&router, Some("k2"), "a").await.status, 404);
    let retry = post_with(&router, Some("k2"), "a").await;
    assert_eq!(
        (retry.status, retry.replayed()),
        (StatusCode::CREATED, false)
    );
}

/// 201 with a cookie and a session header.
fn with_secrets(run: usize, body: Bytes) -> Response<Body> {
    let mut r = created(run, body);
    r.headers_mut()
        .insert("x-session-token", http::HeaderValue::from_static("t"));
    r
}

/// `deny_headers` adds to the default list, so adding one header cannot re-enable the
/// replay of `Set-Cookie`; replacing the list is explicit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_headers_adds_to_the_default_list() {
    let server = RedisServer::start();
    let session = http::HeaderName::from_static("x-session-token");
    let backend = Backend::new(with_secrets);
    let router = app(
        &backend,
        layer(&server).await.deny_headers([session.clone()]),
    );
    post_with(&router, Some("k"), "a").await;
    let replay = post_with(&router, Some("k"), "a").await;
    assert!(replay.replayed());
    assert_eq!(replay.header("set-cookie"), "", "set-cookie stays denied");
    assert_eq!(replay.header("x-session-token"), "");
    assert_eq!(replay.header("x-run"), "1");

    let backend = Backend::new(with_secrets);
    let router = app(
        &backend,
        layer(&server).await.replace_deny_headers([session]),
    );
    post_with(&router, Some("k2"), "a").await;
    let replay = post_with(&router, Some("k2"), "a").await;
    assert_eq!(
        replay.header("set-cookie"),
        "session=1",
        "the list was replaced"
    );
    assert_eq!(replay.header("x-session-token"), "");
}

/// A keyed request without a principal is refused unless anonymous keys are allowed
/// explicitly: in one shared "anonymous" scope a cookie-authenticated app would replay
/// one user's response to another who guessed the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_requests_without_a_principal_are_refused_by_default() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(&backend, idem::strict_layer(&server).await);
    let r = post_with(&router, Some("guessable"), "a").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.header("content-type"), "application/problem+json");
    assert!(String::from_utf8_lossy(&r.body).contains("idempotency-principal-missing"));
    assert_eq!(backend.runs(), 0);
    let signed = idem::request(http::Method::POST, Some("guessable"), Some("Bearer a"), "a");
    assert_eq!(
        idem::send(&router, signed).await.status,
        StatusCode::CREATED
    );
    // Unkeyed requests are not affected.
    assert_eq!(
        post_with(&router, None, "a").await.status,
        StatusCode::CREATED
    );
}

/// The key is an sf-string in the IETF draft: `"a b"` is a valid key. A bare value made
/// of token characters is a key too, taken literally whatever its first character
/// (`12345`, an unquoted UUID), and the same key as its quoted form; other bare items
/// (`?1`, `a b`) are not keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_follow_the_sf_string_syntax() {
    let server = RedisServer::start();
    let backend = Backend::new(created);
    let router = app(&backend, layer(&server).await);
    let first = post_with(&router, Some("\"a b\""), "a").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    post_with(&router, Some("\"a b\""), "a")
        .await
        .assert_replays(&first);
    for item in ["?1", "a b", "a;q=1"] {
        let r = post_with(&router, Some(item), "a").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{item} is not a key");
    }
    // Either form first, the other replays it.
    for (first, other) in [("12345", "\"12345\""), ("\"order-1\"", "order-1")] {
        let original = post_with(&router, Some(first), "a").await;
        assert_eq!(
            original.status,
            StatusCode::CREATED,
            "{first}: {original:?}"
        );
        post_with(&router, Some(other), "a")
            .await
            .assert_replays(&original);
    }
    assert_eq!(backend.runs(), 3);
}
