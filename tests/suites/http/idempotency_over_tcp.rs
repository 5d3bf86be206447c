//! The idempotency and one-time-token layers over real TCP (axum::serve and plain hyper,
//! hyper-util's client or a raw socket) on real Redis.

use crate::support as idem;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use idem::{
    Backend, Reply, app, created, http_client, layer, lock_client, post_tcp, records, serve,
};
use lock_tests::RedisServer;
use lock_tower::one_time_token::OneTimeTokenLayer;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_concurrent_posts_run_the_handler_once() {
    let server = RedisServer::start();
    // The one run waits until half the responses are back, so the rest race it.
    let backend = Backend::gated(1, created);
    let addr = serve(app(&backend, layer(&server).await)).await;
    let client = http_client();
    let (done, mut replies) = mpsc::unbounded_channel();
    for _ in 0..100 {
        let (client, done) = (client.clone(), done.clone());
        tokio::spawn(async move {
            let _ = done.send(post_tcp(&client, addr, "pay-100", "10 EUR").await);
        });
    }
    drop(done);
    let mut all = Vec::new();
    while let Some(reply) = tokio::time::timeout(Duration::from_secs(20), replies.recv())
        .await
        .expect("responses stopped coming")
    {
        all.push(reply);
        if all.len() == 50 {
            backend.open();
        }
    }
    assert_eq!(all.len(), 100);
    assert_eq!(backend.runs(), 1, "the handler body must run exactly once");
    let originals: Vec<&Reply> = all
        .iter()
        .filter(|r| r.status == StatusCode::CREATED && !r.replayed())
        .collect();
    assert_eq!(originals.len(), 1, "one original response");
    let original = originals[0];
    assert_eq!(original.body, r#"{"run":1,"bytes":6}"#);
    let (mut conflicts, mut replays) = (0, 0);
    for r in &all {
        if r.status == StatusCode::CONFLICT {
            assert_eq!(r.header("retry-after"), "1");
            assert_eq!(r.header("content-type"), "application/problem+json");
            conflicts += 1;
        } else if r.replayed() {
            r.assert_replays(original);
            replays += 1;
        }
    }
    assert_eq!(
        conflicts + replays,
        99,
        "only the original, 409s and replays"
    );
    // A sequential retry afterwards.
    let retry = post_tcp(&client, addr, "pay-100", "10 EUR").await;
    retry.assert_replays(original);
    assert_eq!(retry.header("idempotent-replayed"), "true");
}

/// Says when the request futures of the layers inside it are dropped (or done).
fn on_request_dropped(router: Router) -> (Router, tokio::sync::mpsc::UnboundedReceiver<()>) {
    struct Signal(mpsc::UnboundedSender<()>);
    impl Drop for Signal {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let router = router.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let signal = Signal(tx.clone());
            async move {
                let response = next.run(request).await;
                drop(signal);
                response
            }
        },
    ));
    (router, rx)
}

/// A client that goes away while the handler runs does not cut it short: the handler
/// finishes, its response is stored, and the retry is replayed, the handler having
/// run once (cut at an await, it might have done part of its work).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_handler_gets_the_response_on_retry() {
    let server = RedisServer::start();
    let backend = Backend::gated(1, created);
    let (router, mut dropped) = on_request_dropped(app(&backend, layer(&server).await));
    let addr = serve(router).await;
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket
        .write_all(
            b"POST /pay HTTP/1.1\r\nhost: test\r\nidempotency-key: gone\r\n\
              content-type: text/plain\r\ncontent-length: 6\r\n\r\n10 EUR",
        )
        .await
        .unwrap();
    backend.entered(1).await;
    drop(socket);
    tokio::time::timeout(Duration::from_secs(5), dropped.recv())
        .await
        .expect("the server never dropped the request of the client that left");
    backend.open();
    let client = http_client();
    let mut retry = post_tcp(&client, addr, "gone", "10 EUR").await;
    // 409 until the first run's response is stored.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while retry.status == StatusCode::CONFLICT && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        retry = post_tcp(&client, addr, "gone", "10 EUR").await;
    }
    assert_eq!(
        (retry.status, retry.replayed(), retry.header("x-run")),
        (StatusCode::CREATED, true, "1"),
        "{retry:?}"
    );
    assert_eq!(backend.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_hyper_serves_the_layer_too() {
    use hyper_util::rt::TokioIo;
    use hyper_util::service::TowerToHyperService;
    use tower::ServiceBuilder;

    let server = RedisServer::start();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = tower::service_fn(move |_: Request<Body>| {
        let run = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("run {run}"))))) }
    });
    let service = ServiceBuilder::new()
        .map_request(|r: Request<hyper::body::Incoming>| r.map(Body::new))
        .layer(layer(&server).await)
        .service(handler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    let client = http_client();
    let first = post_tcp(&client, addr, "hyper-1", "a").await;
    assert_eq!(
        (first.status, &first.body[..]),
        (StatusCode::OK, &b"run 1"[..])
    );
    post_tcp(&client, addr, "hyper-1", "a")
        .await
        .assert_replays(&first);
    assert_eq!(post_tcp(&client, addr, "hyper-1", "b").await.status, 422);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_time_token_accepts_exactly_one_of_fifty_submissions() {
    let server = RedisServer::start();
    let tokens = lock_client(&server).await.one_time_tokens("forms");
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let router = Router::new()
        .route(
            "/checkout",
            post(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { "ordered" }
            }),
        )
        .layer(OneTimeTokenLayer::new(tokens.clone(), "checkout"));
    let addr = serve(router).await;
    let client = http_client();
    let submit = |token: Option<String>| {
        let client = client.clone();
        async move {
            let mut b = Request::post(format!("http://{addr}/checkout"));
            if let Some(t) = token {
                b = b.header("one-time-token", t);
            }
            let r = b.body(Full::new(Bytes::new())).unwrap();
            Reply::read(client.request(r).await.unwrap()).await
        }
    };
    let token = tokens
        .issue("checkout", Duration::from_secs(60))
        .await
        .unwrap();
    let calls: Vec<_> = (0..50)
        .map(|_| tokio::spawn(submit(Some(token.clone()))))
        .collect();
    let mut statuses = Vec::new();
    for c in calls {
        statuses.push(c.await.unwrap().status);
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let used = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((ok, used), (1, 49), "{statuses:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(submit(None).await.status, StatusCode::BAD_REQUEST);
    // A token of another scope is refused.
    let other = tokens
        .issue("other", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(submit(Some(other)).await.status, StatusCode::CONFLICT);
}

/// A response of unknown length past the storable limit is not buffered whole: the layer
/// reads at most the limit (plus a frame), frees the key, and streams the rest, so the
/// client gets the head and the first bytes while the handler's body is still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_streamed_response_flows_through_unstored() {
    use http_body_util::BodyExt;

    let server = RedisServer::start();
    // Each run hands the test the sender feeding its response body.
    let (feeds_tx, mut feeds) = mpsc::unbounded_channel::<mpsc::UnboundedSender<Bytes>>();
    let handler = move || {
        let feeds_tx = feeds_tx.clone();
        async move {
            let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
            feeds_tx.send(tx).unwrap();
            Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
            }))
        }
    };
    let router = Router::new()
        .route("/pay", post(handler))
        .layer(layer(&server).await.max_stored_bytes(100));
    let addr = serve(router).await;
    let client = http_client();
    let send = || {
        let r = Request::post(format!("http://{addr}/pay"))
            .header("idempotency-key", "stream")
            .body(Full::new(Bytes::new()))
            .unwrap();
        tokio::spawn(client.request(r))
    };

    let pending = send();
    let feed = feeds.recv().await.unwrap();
    feed.send(Bytes::from(vec![b'a'; 150])).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the response head waited for the end of an over-limit body")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body();
    let mut read = Vec::new();
    while read.len() < 150 {
        let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
            .await
            .expect("the bytes read so far are sent before the body ends")
            .unwrap()
            .unwrap();
        read.extend_from_slice(&frame.into_data().unwrap());
    }
    assert!(records(&server).await.is_empty(), "the key is freed");
    feed.send(Bytes::from_static(b"tail")).unwrap();
    drop(feed);
    read.extend_from_slice(&body.collect().await.unwrap().to_bytes());
    assert_eq!(read.len(), 154);
    assert!(read.ends_with(b"atail"));

    // Nothing was stored: a retry runs again.
    let pending = send();
    let feed = feeds.recv().await.unwrap();
    feed.send(Bytes::from(vec![b'b'; 150])).unwrap();
    drop(feed);
    let retry = Reply::read(pending.await.unwrap().unwrap()).await;
    assert!(!retry.replayed());
    assert_eq!(retry.body, vec![b'b'; 150]);
}

/// A gRPC-style answer whose trailers are declared in `Trailer`, as HTTP/1.1 needs.
fn with_declared_trailers(run: usize, _body: Bytes) -> Response<Body> {
    use hyper::body::Frame;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert("x-run-trailer", run.to_string().parse().unwrap());
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from_static(b"ok"))),
        Ok(Frame::trailers(trailers)),
    ];
    Response::builder()
        .status(StatusCode::OK)
        .header("trailer", "grpc-status, x-run-trailer")
        .body(Body::new(http_body_util::StreamBody::new(
            futures_util::stream::iter(frames),
        )))
        .unwrap()
}

/// One POST over a raw HTTP/1.1 socket that accepts trailers; the whole answer.
async fn post_accepting_trailers(addr: std::net::SocketAddr, key: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /pay HTTP/1.1\r\nhost: test\r\nidempotency-key: {key}\r\nte: trailers\r\n\
         connection: close\r\ncontent-length: 0\r\n\r\n"
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut answer))
        .await
        .expect("no whole answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).to_lowercase()
}

/// Over HTTP/1.1, trailers go out only in a chunked body and only when declared in
/// `Trailer`: the first answer and its replay keep both, as the handler's own answer
/// does without the layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_trailers_reach_an_http1_client_first_and_on_replay() {
    let server = RedisServer::start();
    let backend = Backend::new(with_declared_trailers);
    let plain = serve(app(&backend, tower::layer::util::Identity::new())).await;
    let guarded = serve(app(&backend, layer(&server).await)).await;
    let control = post_accepting_trailers(plain, "none").await;
    let first = post_accepting_trailers(guarded, "t").await;
    let replay = post_accepting_trailers(guarded, "t").await;
    for (what, answer, run) in [
        ("without the layer", &control, 1),
        ("the first", &first, 2),
        ("the replay", &replay, 2),
    ] {
        assert!(
            answer.contains("transfer-encoding: chunked"),
            "{what}: not chunked: {answer:?}"
        );
        let end = answer
            .find("\r\n0\r\n")
            .unwrap_or_else(|| panic!("{what}: no last chunk: {answer:?}"));
        let tail = &answer[end..];
        assert!(
            tail.contains("grpc-status: 0") && tail.contains(&format!("x-run-trailer: {run}")),
            "{what}: no trailers after the body: {answer:?}"
        );
    }
    assert!(replay.contains("idempotent-replayed: true"), "{replay:?}");
    assert_eq!(backend.runs(), 2);
}
