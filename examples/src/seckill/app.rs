//! What every handler shares. It sits below the server, the routes and the order path,
//! which import it and never each other upwards.

use std::sync::Arc;

use lock_core::{IdGenerator, LockClient};
use metrics_exporter_prometheus::PrometheusHandle;
use redis::aio::ConnectionManager;

use super::queue::OrderQueue;
use super::store::Storage;

/// The shared state of an instance; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct App {
    /// Locks (`#[cache_lock]`), ids, the rate limiter and idempotency records.
    pub(crate) locks: LockClient,
    /// Stock script and vouchers' live state.
    pub(crate) redis: ConnectionManager,
    pub(crate) ids: IdGenerator,
    /// The orders database.
    pub(crate) store: Arc<dyn Storage>,
    /// The queue accepted orders wait in until they are persisted.
    pub(crate) queue: Arc<dyn OrderQueue>,
    /// What `GET /metrics` renders (`None`: another recorder was installed first).
    pub(crate) metrics: Option<PrometheusHandle>,
}
