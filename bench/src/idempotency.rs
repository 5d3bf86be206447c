//! `scripts/bench idempotency`: requests per second over HTTP on loopback, one load
//! client (hyper-util's pooled client, `TASKS` requests in flight), against two axum
//! servers in this process: the POST handler behind `IdempotencyLayer` (`ours`), and the
//! same handler doing the equivalent Redis round trips by hand (`by_hand`: claim with
//! `SET NX GET`, store with `SET`, both with expiries). Interleaved rounds, judged on
//! the per-round ratios.
//!
//! - `fresh`: every request has a new key (claim, run, store). Its records are kept for
//!   [`FRESH_RETENTION`] on both servers, so that the keyspace holds steady through the
//!   run: a keyspace that only grows rehashes its table and faults in new pages now
//!   and then, and each such pause slows whichever implementation's turn it falls in,
//!   which spreads the per-round ratios.
//! - `replay`: every request repeats one completed key (look up, replay), on a second
//!   pair of servers that keep records for a day.
//!
//! Prints `idempotency <path>_<impl>_requests_per_s`, per-round rates, CPU per request,
//! and `ratio idempotency_<path>_ours_vs_by_hand` (the median of the per-round ratios;
//! target: at least 0.9).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use lock_core::LockClient;
use lock_tower::idempotency::IdempotencyLayer;
use redis::aio::ConnectionManager;

use crate::figure::Figure;
use crate::measure::{
    BoxError, Cycle, Timing, cycle, measure_rounds, median, median_rates, rates, rounds_list,
};

/// Requests in flight at once.
const TASKS: usize = 32;
/// Implementations measured: two paths times two implementations.
pub const MEASUREMENTS: usize = 4;
const IN_FLIGHT_MS: u64 = 10_000;
/// How long the replay servers keep a completed record (the one key every replay
/// repeats must outlive the run).
const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long the fresh servers keep a completed record: long past the request, and
/// short beside a turn (2 s by default), so that Redis expires an implementation's
/// records during its own turn rather than during the next implementation's.
const FRESH_RETENTION: Duration = Duration::from_millis(250);

/// The handler's own work, the same in both servers.
fn work(body: &[u8]) -> Response<Body> {
    Response::builder()
        .status(StatusCode::CREATED)
        .header("content-type", "application/json")
        .body(Body::from(format!("{{\"paid\":{}}}", body.len())))
        .unwrap_or_default()
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = code;
    r
}

/// The by-hand version: one round trip to claim (or find the stored body), one to store.
async fn by_hand(
    State((conn, retention)): State<(ConnectionManager, Duration)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) else {
        return status(StatusCode::BAD_REQUEST);
    };
    let key = format!("hand:{key}");
    let mut c = conn.clone();
    let claim = redis::cmd("SET")
        .arg(&key)
        .arg("")
        .arg("NX")
        .arg("PX")
        .arg(IN_FLIGHT_MS)
        .arg("GET")
        .query_async::<Option<Vec<u8>>>(&mut c)
        .await;
    match claim {
        Ok(None) => {
            let response = work(&body);
            let (parts, body) = response.into_parts();
            let Ok(bytes) = body.collect().await.map(|b| b.to_bytes()) else {
                return status(StatusCode::INTERNAL_SERVER_ERROR);
            };
            let stored = redis::cmd("SET")
                .arg(&key)
                .arg(bytes.as_ref())
                .arg("PX")
                .arg(u64::try_from(retention.as_millis()).unwrap_or(u64::MAX))
                .query_async::<()>(&mut c)
                .await;
            match stored {
                Ok(()) => Response::from_parts(parts, Body::from(bytes)),
                Err(_) => status(StatusCode::SERVICE_UNAVAILABLE),
            }
        }
        Ok(Some(v)) if v.is_empty() => status(StatusCode::CONFLICT),
        Ok(Some(v)) => {
            let mut r = work(b"");
            *r.body_mut() = Body::from(v);
            r.headers_mut().insert(
                "idempotent-replayed",
                http::HeaderValue::from_static("true"),
            );
            r
        }
        Err(_) => status(StatusCode::SERVICE_UNAVAILABLE),
    }
}

async fn serve(router: Router) -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok(addr)
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One POST; fails unless the answer is 201 and, if `replay` says which, marked as a
/// replay or not.
async fn send(
    client: &HttpClient,
    addr: SocketAddr,
    key: String,
    replay: Option<bool>,
) -> Result<(), BoxError> {
    let request = Request::post(format!("http://{addr}/pay"))
        .header("idempotency-key", key)
        // Keys are scoped per caller: a keyed request without one is refused (400).
        .header("authorization", "Bearer bench")
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from_static(b"10 EUR")))?;
    let response = client.request(request).await?;
    let replayed = response.headers().contains_key("idempotent-replayed");
    let status = response.status();
    response.into_body().collect().await?;
    if status != StatusCode::CREATED || replay.is_some_and(|r| r != replayed) {
        return Err(format!("unexpected answer {status} (replayed: {replayed})").into());
    }
    Ok(())
}

/// The one key every replay repeats.
const REPLAY_KEY: &str = "replay-replay";

fn requests(client: &HttpClient, addr: SocketAddr, replay: bool) -> Cycle {
    let (client, next) = (client.clone(), Arc::new(AtomicU64::new(0)));
    cycle(move |_, _| {
        let client = client.clone();
        // Fresh keys are unique across rounds; replays repeat the one completed key.
        let key = match replay {
            true => REPLAY_KEY.to_owned(),
            false => format!("fresh-{}", next.fetch_add(1, Ordering::Relaxed)),
        };
        async move { send(&client, addr, key, Some(replay)).await }
    })
}

/// The implementations, in measuring order: the names of the rate lines and of
/// `lock-bench ops idempotency.<name>`.
pub const OPS: [&str; MEASUREMENTS] = [
    "fresh_by_hand",
    "fresh_ours",
    "replay_by_hand",
    "replay_ours",
];

/// The POST handler behind `IdempotencyLayer`, on a port of its own, keeping records
/// for `retention`.
async fn serve_ours(url: &str, retention: Duration) -> Result<SocketAddr, BoxError> {
    let lock_client = LockClient::open(url).await?;
    let layer = IdempotencyLayer::new(lock_client.idempotency_store("bench"))
        .require_key(true)
        .retention(retention)?;
    serve(
        Router::new()
            .route("/pay", post(|body: Bytes| async move { work(&body) }))
            .layer(layer),
    )
    .await
}

/// The same handler doing the Redis round trips by hand, on a port of its own.
async fn serve_by_hand(url: &str, retention: Duration) -> Result<SocketAddr, BoxError> {
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    serve(
        Router::new()
            .route("/pay", post(by_hand))
            .with_state((conn, retention)),
    )
    .await
}

/// Implementation `name`'s cycle, on a server of its own with the retention of its
/// path. A replay server first completes the key every replay repeats (unless a run
/// before did); the fresh servers' short retention would let it expire mid-run.
async fn cycle_for(url: &str, client: &HttpClient, name: &str) -> Result<Cycle, BoxError> {
    let replay = name.starts_with("replay");
    let retention = if replay { RETENTION } else { FRESH_RETENTION };
    let addr = match name.ends_with("ours") {
        true => serve_ours(url, retention).await?,
        false => serve_by_hand(url, retention).await?,
    };
    if replay {
        send(client, addr, REPLAY_KEY.to_owned(), None).await?;
    }
    Ok(requests(client, addr, replay))
}

/// Implementation `name`'s cycle with its server on `url`, for `lock-bench ops`;
/// `None` for an unknown name.
pub async fn op(url: &str, name: &str) -> Result<Option<Cycle>, BoxError> {
    if !OPS.contains(&name) {
        return Ok(None);
    }
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    Ok(Some(cycle_for(url, &client, name).await?))
}

pub async fn run(url: &str, timing: Timing, rounds: usize) -> Result<Vec<Figure>, BoxError> {
    let mut probe = ConnectionManager::new(redis::Client::open(url)?).await?;
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut cycles = Vec::with_capacity(OPS.len());
    for name in OPS {
        cycles.push(cycle_for(url, &client, name).await?);
    }
    let samples = measure_rounds(&mut probe, &cycles, TASKS, timing, rounds).await?;
    let medians = median_rates(&samples);
    for ((name, s), r) in OPS.iter().zip(&samples).zip(&medians) {
        println!("idempotency tasks={TASKS} {name}_requests_per_s {r:.0}");
        println!(
            "idempotency tasks={TASKS} {name}_requests_per_s_rounds {}",
            rounds_list(rates(s))
        );
        println!(
            "idempotency tasks={TASKS} {name}_cpu_us_per_request redis {:.1} process {:.1}",
            median(s.iter().map(|s| s.server_us)),
            median(s.iter().map(|s| s.client_us))
        );
    }
    let mut figures = Vec::new();
    for (name, a, b) in [("fresh", 1, 0), ("replay", 3, 2)] {
        let name = format!("idempotency_{name}_ours_vs_by_hand");
        let f = Figure::rounds(name, "requests/s", &rates(&samples[a]), &rates(&samples[b]));
        println!("{}", f.ratio_line());
        figures.push(f.target(0.9));
    }
    Ok(figures)
}
