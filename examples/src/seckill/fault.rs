//! Fault injection for the crash tests, outside the order path: a layer around the
//! order handler, installed only when `seckill-server` is given `--crash-after-takes`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::MethodRouter;

use super::app::App;

/// Wraps the order handler so the process exits once `limit` orders were answered 201,
/// before that answer reaches the idempotency layer and the buyer: the unit is taken
/// and queued, and nobody hears of it. Every taken unit is a 201 from the handler, so
/// counting 201s counts takes.
pub(crate) fn crash_after_takes(handler: MethodRouter<App>, limit: u64) -> MethodRouter<App> {
    let taken = Arc::new(AtomicU64::new(0));
    handler.layer(middleware::from_fn(move |request: Request, next: Next| {
        let taken = taken.clone();
        async move {
            let response: Response = next.run(request).await;
            if response.status() == StatusCode::CREATED
                && taken.fetch_add(1, Ordering::Relaxed) + 1 >= limit
            {
                tracing::error!(
                    limit,
                    "crash_after_takes reached: exiting before the answer"
                );
                std::process::exit(3);
            }
            response
        }
    }))
}
