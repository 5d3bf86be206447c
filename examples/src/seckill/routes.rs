//! The HTTP API: routes, handlers and the checks of what clients send.

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, Request, State};
use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, get, post};
use lock_core::{IdempotencyStore, RateLimiter};
use lock_tower::idempotency::IdempotencyLayer;
use lock_tower::rate_limit::RateLimitLayer;
use serde_json::json;

use super::app::App;
use super::fault;
use super::order;
use super::problem::{self, AppError, Problem};
use super::queue::Backlog;
use super::store::StoreError;
use super::voucher;

/// The header naming the buyer (a stand-in for authentication).
const USER_HEADER: &str = "x-user-id";

/// The service's routes; see the README for the API. `crash_after_takes`: the tests'
/// fault layer around the order handler (see `fault.rs`).
pub(crate) fn router(
    app: App,
    limiter: RateLimiter,
    idempotency: IdempotencyStore,
    crash_after_takes: Option<u64>,
) -> Router {
    // Outermost first: who is it (400), too fast (429), a retry (replayed), then the
    // handler with its lock. One `ServiceBuilder` stack is one boxed route, which axum
    // clones once per request; a `.layer` call per protection would box (and clone)
    // each of them.
    let protections = tower::ServiceBuilder::new()
        .layer(middleware::from_fn(require_user))
        .layer(RateLimitLayer::new(limiter, buyer))
        .layer(
            IdempotencyLayer::new(idempotency)
                .require_key(true)
                .in_flight_lease(order::CLAIM_LEASE)
                .expect("CLAIM_LEASE is within MIN_LEASE..=MAX_LEASE")
                .principal(buyer),
        );
    let place_order = with_fault(post::<_, _, App>(create_order), crash_after_takes)
        .layer::<_, std::convert::Infallible>(protections);
    routes(place_order).with_state(app)
}

/// The floor of `scripts/bench seckill` (`seckill-server --floor`): the same routes on
/// the same HTTP stack, but an order only takes its stock (no lock, no idempotency key,
/// no rate limit), to price the protections.
pub(crate) fn floor_router(app: App, crash_after_takes: Option<u64>) -> Router {
    let place_order = with_fault(post(create_order_unprotected), crash_after_takes)
        .layer::<_, std::convert::Infallible>(middleware::from_fn(require_user));
    routes(place_order).with_state(app)
}

fn with_fault(handler: MethodRouter<App>, crash_after_takes: Option<u64>) -> MethodRouter<App> {
    match crash_after_takes {
        Some(limit) => fault::crash_after_takes(handler, limit),
        None => handler,
    }
}

fn routes(place_order: MethodRouter<App>) -> Router<App> {
    Router::new()
        .route("/vouchers", post(create_voucher))
        .route("/vouchers/{id}", get(get_voucher))
        .route("/vouchers/{id}/orders", get(list_orders).merge(place_order))
        .route("/orders/{order_id}", get(get_order))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        // Last, so it wraps everything: unknown routes, wrong methods and axum's own
        // rejections (413) are problem+json too.
        .layer(middleware::from_fn(problem::problem_json_errors))
}

/// The buyer of an order request, parsed once from `X-User-Id` by [`require_user`]
/// and read from the request's extensions by everything after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Buyer(i64);

/// The buyer of a request: `X-User-Id`, a whole number from 1 to `i64::MAX`.
fn user_id(headers: &HeaderMap) -> Result<i64, Problem> {
    let raw = headers.get(USER_HEADER).ok_or_else(|| {
        Problem::bad_request(
            "missing-user-id",
            "send the buyer's id in the X-User-Id header (a whole number, 1 or more)",
        )
    })?;
    raw.to_str()
        .ok()
        .map(str::trim)
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|id| *id >= 1)
        .ok_or_else(|| {
            Problem::bad_request(
                "invalid-user-id",
                format!(
                    "X-User-Id must be a whole number from 1 to {}, got {:?}",
                    i64::MAX,
                    String::from_utf8_lossy(raw.as_bytes())
                ),
            )
        })
}

/// The buyer as the rate limit and the idempotency principal count it: the parsed id,
/// so `7`, `07` and a padded `000…07` (one buyer to the handler) are one quota and one
/// scope, and one user can never replay another's order.
fn buyer(request: &Request<Body>) -> Option<String> {
    request
        .extensions()
        .get::<Buyer>()
        .map(|Buyer(id)| id.to_string())
}

/// Parses `X-User-Id` into the request's [`Buyer`], refusing an order without a valid
/// one before it reaches the rate limiter.
async fn require_user(mut request: Request, next: Next) -> Response {
    match user_id(request.headers()) {
        Ok(id) => {
            request.extensions_mut().insert(Buyer(id));
            next.run(request).await
        }
        Err(problem) => problem.into_response(),
    }
}

/// A numeric id from the path: 400 if it is not one.
fn path_id(path: Result<Path<String>, PathRejection>, what: &str) -> Result<i64, Problem> {
    let raw = path
        .map_err(|e| Problem::bad_request("invalid-id", format!("bad {what} id: {e}")))?
        .0;
    raw.parse::<i64>()
        .ok()
        .filter(|id| *id >= 1)
        .ok_or_else(|| {
            Problem::bad_request(
                "invalid-id",
                format!("a {what} id is a whole number, 1 or more; got {raw:?}"),
            )
        })
}

fn db_unavailable(e: StoreError) -> Problem {
    Problem::unavailable("the orders database", &e)
}

fn redis_unavailable(e: redis::RedisError) -> Problem {
    Problem::unavailable("Redis", &e)
}

/// `POST /vouchers` `{"stock": N, "begins_at"?, "ends_at"?}` -> 201 `{"id": ...}`.
async fn create_voucher(State(app): State<App>, body: Bytes) -> Result<Response, AppError> {
    let spec = voucher::parse_new_voucher(&body)?;
    let id = voucher::create(&app, &spec).await?;
    tracing::info!(id, stock = spec.stock, "voucher created");
    Ok((
        StatusCode::CREATED,
        [(LOCATION, format!("/vouchers/{id}"))],
        Json(json!({ "id": id })),
    )
        .into_response())
}

/// `GET /vouchers/{id}` -> `{"id", "stock_left", "sold"}`.
async fn get_voucher(
    State(app): State<App>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, AppError> {
    let id = path_id(path, "voucher")?;
    match voucher::state(&mut app.redis.clone(), id)
        .await
        .map_err(redis_unavailable)?
    {
        Some(state) => Ok(Json(state).into_response()),
        None => Err(voucher::missing(&app, id).await.into()),
    }
}

/// `POST /vouchers/{id}/orders` (headers `X-User-Id`, `Idempotency-Key`) -> 201
/// `{"order_id": ...}`; see [`order::place_order`] for the refusals.
async fn create_order(
    State(app): State<App>,
    Extension(Buyer(user_id)): Extension<Buyer>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, AppError> {
    let voucher_id = path_id(path, "voucher")?;
    Ok(created(
        order::place_order(&app, voucher_id, user_id).await?,
    ))
}

/// `--floor`'s order: the stock script alone.
async fn create_order_unprotected(
    State(app): State<App>,
    Extension(Buyer(user_id)): Extension<Buyer>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, AppError> {
    let voucher_id = path_id(path, "voucher")?;
    Ok(created(order::take_order(&app, voucher_id, user_id).await?))
}

/// 201 with the order's id and `Location`.
fn created(placed: order::Placed) -> Response {
    let id = placed.order_id.get().to_string();
    (
        StatusCode::CREATED,
        [(LOCATION, format!("/orders/{id}"))],
        Json(json!({ "order_id": id })),
    )
        .into_response()
}

/// `GET /orders/{order_id}` -> the order, once the worker has persisted it.
async fn get_order(
    State(app): State<App>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, AppError> {
    let id = path_id(path, "order")?;
    match app.store.order(id).await.map_err(db_unavailable)? {
        Some(order) => Ok(Json(order).into_response()),
        None => Err(Problem::not_found(format!(
            "no order {id} in the database (an accepted order is written moments after its 201)"
        ))
        .into()),
    }
}

/// `GET /vouchers/{id}/orders` -> `{"voucher_id", "orders": [...]}` from the database.
async fn list_orders(
    State(app): State<App>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, AppError> {
    let id = path_id(path, "voucher")?;
    let orders = app.store.voucher_orders(id).await.map_err(db_unavailable)?;
    if orders.is_empty() && !app.store.has_voucher(id).await.map_err(db_unavailable)? {
        return Err(Problem::not_found(format!("there is no voucher {id}")).into());
    }
    Ok(Json(json!({ "voucher_id": id, "orders": orders })).into_response())
}

/// `GET /healthz` -> 200 with the consumer's figures and the queue's backlog; 503 when
/// the queue is unreachable or the consumer has stopped.
async fn healthz(State(app): State<App>) -> Result<Response, AppError> {
    let backlog = app
        .queue
        .backlog()
        .await
        .map_err(|e| Problem::unavailable("the orders queue", &e))?;
    let worker = app.queue.stats().snapshot();
    let status = if worker.running {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if worker.running { "ok" } else { "worker-stopped" },
        "worker": worker,
        "queue": backlog,
    });
    Ok((status, Json(body)).into_response())
}

/// `GET /metrics` -> lock-core's metrics (acquisitions, waits, holds, renewals, losses,
/// releases, rate-limit decisions, idempotency outcomes) and the queue's gauges (length,
/// pending, undelivered, consumers) in the Prometheus text format.
async fn metrics(State(app): State<App>) -> Result<Response, AppError> {
    let handle = app.metrics.as_ref().ok_or_else(|| {
        Problem::not_found("this process exports no metrics (another recorder was installed)")
    })?;
    handle.run_upkeep();
    let mut text = handle.render();
    // The queue's gauges, read now; left out (with the reason logged) when the queue
    // does not answer, so the rest still reaches the scraper.
    match app.queue.backlog().await {
        Ok(backlog) => text.push_str(&queue_gauges(&backlog)),
        Err(e) => tracing::warn!(error = %e, "queue gauges left out of /metrics"),
    }
    Ok(([(CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// The queue's backlog as Prometheus gauges, labelled with the queue's kind.
fn queue_gauges(b: &Backlog) -> String {
    let gauges = [
        ("seckill_queue_length", "Orders held by the queue", b.length),
        (
            "seckill_queue_pending",
            "Orders delivered to a consumer and not acknowledged",
            b.pending,
        ),
        (
            "seckill_queue_undelivered",
            "1 when orders wait that no consumer has received",
            u64::from(b.undelivered),
        ),
        (
            "seckill_queue_consumers",
            "Consumers of the queue",
            b.consumers,
        ),
    ];
    let mut text = String::new();
    for (name, help, value) in gauges {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{kind=\"{}\"}} {value}\n",
            b.kind
        ));
    }
    text
}
