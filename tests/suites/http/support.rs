//! Helpers for the idempotency layer suites: a counting handler behind a gate, requests
//! through `oneshot` or over real TCP, and the stored records.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use std::convert::Infallible;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use axum::routing::{Route, get, post};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lock_core::{LockClient, LockConfig};
use lock_tests::RedisServer;
use lock_tower::idempotency::IdempotencyLayer;
use tokio::sync::watch;
use tower::{Layer, Service, ServiceExt};

/// Builds the handler's response for run number `run` (1-based) and the request body.
pub type Respond = fn(usize, Bytes) -> Response<Body>;

/// The handler's side: how often it ran, and a gate the first `gated` runs wait at.
pub struct Backend {
    runs: AtomicUsize,
    gated: usize,
    gate: watch::Sender<bool>,
    entered: watch::Sender<usize>,
    respond: Respond,
}

impl Backend {
    pub fn new(respond: Respond) -> Arc<Self> {
        Self::gated(0, respond)
    }

    /// The first `gated` runs wait until [`open`](Self::open) (or 30 s).
    pub fn gated(gated: usize, respond: Respond) -> Arc<Self> {
        Arc::new(Self {
            runs: AtomicUsize::new(0),
            gated,
            gate: watch::Sender::new(false),
            entered: watch::Sender::new(0),
            respond,
        })
    }

    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub fn open(&self) {
        self.gate.send_replace(true);
    }

    /// Waits until the handler has been entered `n` times.
    pub async fn entered(&self, n: usize) {
        let mut rx = self.entered.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|e| *e >= n))
            .await
            .expect("the handler was not entered in time")
            .expect("sender alive");
    }

    /// The handler (for routers a test builds itself).
    pub async fn handle(self: Arc<Self>, body: Bytes) -> Response<Body> {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        self.entered.send_modify(|e| *e = (*e).max(run));
        if run <= self.gated {
            let mut gate = self.gate.subscribe();
            let _ =
                tokio::time::timeout(Duration::from_secs(30), gate.wait_for(|open| *open)).await;
        }
        (self.respond)(run, body)
    }
}

/// 201 JSON naming the run, with a header and a cookie: the usual handler.
pub fn created(run: usize, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .header("x-run", run.to_string())
        .header("set-cookie", format!("session={run}"))
        .body(Body::from(format!(
            "{{\"run\":{run},\"bytes\":{}}}",
            body.len()
        )))
        .unwrap()
}

/// `POST /pay` (and `GET /pay`) served by `backend` behind `layer` (an
/// `IdempotencyLayer` of any key extractor and principal).
pub fn app<L>(backend: &Arc<Backend>, layer: L) -> Router
where
    L: Layer<Route> + Clone + Send + Sync + 'static,
    L::Service: Service<Request<Body>> + Clone + Send + Sync + 'static,
    <L::Service as Service<Request<Body>>>::Response: IntoResponse + 'static,
    <L::Service as Service<Request<Body>>>::Error: Into<Infallible> + 'static,
    <L::Service as Service<Request<Body>>>::Future: Send + 'static,
{
    let b = backend.clone();
    let g = backend.clone();
    Router::new()
        .route("/pay", post(move |body: Bytes| b.clone().handle(body)))
        .route("/pay", get(move || g.clone().handle(Bytes::new())))
        .layer(layer)
}

/// A client whose Redis calls give up after 300 ms (so a killed Redis fails fast).
pub async fn lock_client(server: &RedisServer) -> LockClient {
    let config = LockConfig::new().with_command_timeout(Duration::from_millis(300));
    LockClient::open_with_config(server.url().as_str(), config)
        .await
        .expect("connect lock client")
}

/// The layer on a fresh store with every default but one: the suites' clients are
/// mostly anonymous, so anonymous keys are allowed.
pub async fn layer(server: &RedisServer) -> IdempotencyLayer {
    strict_layer(server).await.allow_anonymous(true)
}

/// The layer on a fresh store with every default.
pub async fn strict_layer(server: &RedisServer) -> IdempotencyLayer {
    IdempotencyLayer::new(lock_client(server).await.idempotency_store("idem"))
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub async fn read<B>(r: Response<B>) -> Self
    where
        B: axum::body::HttpBody,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = r.into_parts();
        Self {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("response body").to_bytes(),
        }
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or("<not text>"))
    }

    /// Status, body and headers, except what a replay adds or leaves out on purpose
    /// (`idempotent-replayed`, `set-cookie`) and what the server adds per response
    /// (`date`).
    pub fn assert_replays(&self, original: &Reply) {
        assert!(self.replayed(), "not a replay: {self:?}");
        assert_eq!(self.status, original.status);
        assert_eq!(self.body, original.body, "replayed body differs");
        let kept = |h: &HeaderMap| {
            let mut v: Vec<(String, Vec<u8>)> = h
                .iter()
                .filter(|(n, _)| {
                    !["idempotent-replayed", "set-cookie", "date"].contains(&n.as_str())
                })
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(kept(&self.headers), kept(&original.headers));
    }
}

/// A request; `key` is the raw `Idempotency-Key` value.
pub fn request(method: Method, key: Option<&str>, auth: Option<&str>, body: &str) -> Request<Body> {
    let mut b = Request::builder().method(method).uri("/pay");
    if let Some(k) = key {
        b = b.header("idempotency-key", k);
    }
    if let Some(a) = auth {
        b = b.header("authorization", a);
    }
    b.header("content-type", "text/plain")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

/// `POST /pay` with `key` through `router.oneshot`.
pub async fn post_with(router: &Router, key: Option<&str>, body: &str) -> Reply {
    send(router, request(Method::POST, key, None, body)).await
}

pub async fn send(router: &Router, request: Request<Body>) -> Reply {
    Reply::read(router.clone().oneshot(request).await.unwrap()).await
}

/// The idempotency records in Redis right now.
pub async fn records(server: &RedisServer) -> Vec<String> {
    let mut c = server.connection().await;
    redis::cmd("KEYS")
        .arg("*:idempotency")
        .query_async(&mut c)
        .await
        .expect("KEYS")
}

/// Serves `router` with `axum::serve` on a fresh loopback port.
pub async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await });
    addr
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// hyper-util's pooled HTTP/1.1 client.
pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// `POST http://addr/pay` over TCP.
pub async fn post_tcp(client: &HttpClient, addr: SocketAddr, key: &str, body: &str) -> Reply {
    let r = Request::post(format!("http://{addr}/pay"))
        .header("idempotency-key", key)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    Reply::read(client.request(r).await.expect("HTTP request")).await
}
