//! What one layer's requests share: the store and every setting, with their defaults.

use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use lock_core::IdempotencyStore;

/// The settings every request of one layer shares.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) store: IdempotencyStore,
    pub(crate) methods: Vec<Method>,
    pub(crate) require_key: bool,
    pub(crate) max_body_bytes: usize,
    pub(crate) max_stored_bytes: usize,
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) wait: Duration,
    pub(crate) detached_limit: Duration,
    pub(crate) store_server_errors: bool,
    pub(crate) store_status: fn(StatusCode) -> bool,
    pub(crate) deny_headers: Vec<HeaderName>,
    pub(crate) allow_anonymous: bool,
    pub(crate) fail_closed: bool,
}

impl Settings {
    /// Every default, on `store` (each setter of the layer documents its own).
    pub(crate) fn new(store: IdempotencyStore) -> Self {
        Self {
            store,
            methods: vec![Method::POST, Method::PATCH],
            require_key: false,
            max_body_bytes: 1024 * 1024,
            max_stored_bytes: 1024 * 1024,
            retention: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(10),
            wait: Duration::ZERO,
            detached_limit: Duration::from_secs(60),
            store_server_errors: false,
            store_status: stored_by_default,
            deny_headers: vec![HeaderName::from_static("set-cookie")],
            allow_anonymous: false,
            fail_closed: true,
        }
    }
}

/// The default of [`IdempotencyLayer::store_status`](super::IdempotencyLayer::store_status):
/// `false` for the statuses that ask for a retry (408 Request Timeout, 425 Too Early,
/// 429 Too Many Requests), `true` for the rest.
pub fn stored_by_default(status: StatusCode) -> bool {
    !matches!(
        status,
        StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS
    )
}
