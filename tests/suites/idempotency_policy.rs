//! IdempotencyLayer policy on real Redis (issue 14): which responses are stored, which
//! headers are replayed, whose key it is, and what a key is.

mod common;
#[path = "common/idempotency.rs"]
mod idem;

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

/// Item 4: a refusal that tells the client to retry was stored and replayed for 24 h,
/// so the retry got the refusal again after the condition passed.
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

/// Item 4: which statuses are stored is a setting; by default a plain 404 is.
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
