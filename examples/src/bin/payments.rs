//! An idempotent payments endpoint behind `IdempotencyLayer`: a client that retries a
//! POST with the same `Idempotency-Key` is charged once and gets the first answer back.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run -p lock-examples --bin payments
//! curl -X POST localhost:3000/payments -H 'Authorization: Bearer alice' \
//!      -H 'Idempotency-Key: "pay-1"' -H 'Content-Type: application/json' -d '{"cents":500}'
//! # the same again: the same 201 and body, with Idempotent-Replayed: true
//! # the same key with another body: 422; GET /charges: how many charges ran
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use lock_core::LockClient;
use lock_examples::programs::{ProgramArgs, exit_on_error, serve};
use lock_tower::idempotency::IdempotencyLayer;

/// Charges this process ran (what a duplicate must not add to).
#[derive(Clone, Default)]
struct Charges(Arc<AtomicU64>);

async fn charge(State(charges): State<Charges>, body: String) -> (StatusCode, String) {
    let n = charges.0.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        format!("{{\"payment\":{n},\"request\":{body}}}\n"),
    )
}

async fn count(State(charges): State<Charges>) -> String {
    format!("{}\n", charges.0.load(Ordering::SeqCst))
}

const ABOUT: &str = "An idempotent payments endpoint: a retried POST with the same Idempotency-Key is charged once.";

#[tokio::main]
async fn main() {
    exit_on_error(
        "payments",
        async {
            let args = ProgramArgs::parse("payments", ABOUT);
            let addr = args.listen;
            let locks = LockClient::open(args.redis.as_str()).await?;
            // Keys are scoped per caller (a hash of Authorization) and fingerprinted:
            // a retry replays, another payload under the same key is 422.
            let idempotency = IdempotencyLayer::new(locks.idempotency_store("payments"));
            let router = Router::new()
                .route("/payments", post(charge).layer(idempotency))
                .route("/charges", get(count))
                .with_state(Charges::default());
            serve("payments", addr, router).await
        }
        .await,
    );
}
