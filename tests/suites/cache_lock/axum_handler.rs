//! `#[cache_lock]` on an axum handler answering lock-tower's `Problem`: duplicates for
//! one user get a 409 problem+json.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::routing::post;
use http::{Request, StatusCode};
use lock_core::LockClient;
use lock_macros::cache_lock;
use lock_tests::RedisServer;
use lock_tower::problem::Problem;
use tokio::sync::{Notify, Semaphore};
use tower::ServiceExt;

#[derive(Clone)]
struct App {
    locks: LockClient,
    /// The handler holds the lock until the test lets it go.
    proceed: Arc<Semaphore>,
    entered: Arc<Notify>,
}

#[cache_lock(prefix = "order", key = user_id, client = app.locks)]
async fn place_order(State(app): State<App>, Path(user_id): Path<u64>) -> Result<String, Problem> {
    app.entered.notify_one();
    app.proceed.acquire().await.expect("open").forget();
    Ok(format!("order for {user_id}"))
}

fn post_order(user: u64) -> Request<axum::body::Body> {
    Request::post(format!("/users/{user}/orders"))
        .body(axum::body::Body::empty())
        .unwrap()
}

async fn body_text(r: Response) -> String {
    let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_user_twice_gets_409_and_different_users_pass() {
    let server = RedisServer::start();
    let app = App {
        locks: LockClient::open(server.url().as_str()).await.unwrap(),
        proceed: Arc::new(Semaphore::new(0)),
        entered: Arc::new(Notify::new()),
    };
    let router = Router::new()
        .route("/users/{user_id}/orders", post(place_order))
        .with_state(app.clone());

    let first = tokio::spawn(router.clone().oneshot(post_order(1)));
    app.entered.notified().await; // user 1's order holds the lock now
    let dup = router.clone().oneshot(post_order(1)).await.unwrap();
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    assert_eq!(dup.headers()["content-type"], "application/problem+json");
    let retry: u64 = dup.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "Retry-After {retry}");
    assert!(
        body_text(dup)
            .await
            .starts_with(r#"{"type":"lock-busy","title":"Conflict","status":409,"detail":"#)
    );

    // Another user is not blocked by user 1's lock.
    let other = tokio::spawn(router.clone().oneshot(post_order(2)));
    app.entered.notified().await;
    app.proceed.add_permits(2);
    for r in [first.await.unwrap().unwrap(), other.await.unwrap().unwrap()] {
        assert_eq!(r.status(), StatusCode::OK);
        assert!(body_text(r).await.starts_with("order for "));
    }
    // The lock was released: user 1 may order again.
    let again = tokio::spawn(router.clone().oneshot(post_order(1)));
    app.entered.notified().await;
    app.proceed.add_permits(1);
    let r = tokio::time::timeout(Duration::from_secs(2), again)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}
