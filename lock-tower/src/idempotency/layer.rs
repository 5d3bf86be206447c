use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, StatusCode};
use lock_core::{IdempotencyStore, LockError};
use tower::Layer;

use super::key::HeaderKey;
use super::scope::AuthorizationHash;
use super::service::{IdempotencyService, Shared};
use super::settings::Settings;

/// Makes POST and PATCH requests idempotent by key; see the [module docs](super).
///
/// `K` finds the key ([`KeyExtractor`](crate::KeyExtractor), default [`HeaderKey`]: the
/// `Idempotency-Key` header), `P` says whose it is ([`Principal`](super::Principal),
/// default [`AuthorizationHash`]). Every setter documents its default.
#[derive(Debug, Clone)]
pub struct IdempotencyLayer<K = HeaderKey, P = AuthorizationHash> {
    settings: Settings,
    extractor: K,
    principal: P,
}

impl IdempotencyLayer {
    /// Idempotency on `store`, with every default.
    pub fn new(store: IdempotencyStore) -> Self {
        Self {
            settings: Settings::new(store),
            extractor: HeaderKey::default(),
            principal: AuthorizationHash,
        }
    }
}

impl<K, P> IdempotencyLayer<K, P> {
    /// Where the key comes from. Default: [`HeaderKey`], the `Idempotency-Key` header.
    pub fn key_extractor<K2>(self, extractor: K2) -> IdempotencyLayer<K2, P> {
        IdempotencyLayer {
            settings: self.settings,
            extractor,
            principal: self.principal,
        }
    }

    /// Whose key it is. Default: [`AuthorizationHash`].
    pub fn principal<P2>(self, principal: P2) -> IdempotencyLayer<K, P2> {
        IdempotencyLayer {
            settings: self.settings,
            extractor: self.extractor,
            principal,
        }
    }

    /// `true`: a protected request without a key gets 400. Default `false`: it passes
    /// through unprotected.
    pub fn require_key(mut self, required: bool) -> Self {
        self.settings.require_key = required;
        self
    }

    /// The methods protected; others pass through untouched. Default POST and PATCH.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings.methods = methods.into_iter().collect();
        self
    }

    /// Largest request body buffered (to fingerprint and replay it to the handler);
    /// a larger one gets 413. Default 1 MiB.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_body_bytes = bytes;
        self
    }

    /// Largest response body stored. A larger one is passed to the client but not
    /// stored, and the key is freed (a retry runs again), with a warning. Default 1 MiB.
    pub fn max_stored_bytes(mut self, bytes: usize) -> Self {
        self.settings.max_stored_bytes = bytes;
        self
    }

    /// How long a completed response is replayed: 1 ms to
    /// [`IdempotencyStore::MAX_RETENTION`] (366 days). Default 24 h.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] for a retention outside that range, so a layer
    /// holds only a retention the store accepts and no request can meet a bad one.
    ///
    /// ```
    /// # fn demo(store: lock_core::IdempotencyStore) -> Result<(), lock_core::LockError> {
    /// use std::time::Duration;
    /// use lock_tower::idempotency::IdempotencyLayer;
    ///
    /// let week = IdempotencyLayer::new(store.clone()).retention(Duration::from_secs(7 * 86_400))?;
    /// assert!(IdempotencyLayer::new(store).retention(Duration::ZERO).is_err());
    /// # let _ = week; Ok(()) }
    /// ```
    pub fn retention(mut self, retention: Duration) -> Result<Self, LockError> {
        let max = IdempotencyStore::MAX_RETENTION;
        // The store keeps whole milliseconds: less than one would expire at once.
        if retention < Duration::from_millis(1) || retention > max {
            return Err(LockError::InvalidConfig(format!(
                "idempotency retention {retention:?} is outside 1ms..={max:?}"
            )));
        }
        self.settings.retention = retention;
        Ok(self)
    }

    /// The in-flight lease: renewed every third of it while the handler runs and its
    /// response is read, so a crashed server frees the key this long after its last
    /// renewal. Default 10 s.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidConfig`] for a lease outside
    /// [`lock_core::MIN_LEASE`]`..=`[`lock_core::MAX_LEASE`], so a layer that would
    /// fail every request is refused where it is configured.
    pub fn in_flight_lease(mut self, lease: Duration) -> Result<Self, LockError> {
        let (min, max) = (lock_core::MIN_LEASE, lock_core::MAX_LEASE);
        if lease < min || lease > max {
            return Err(LockError::InvalidConfig(format!(
                "idempotency in-flight lease {lease:?} is outside {min:?}..={max:?}"
            )));
        }
        self.settings.lease = lease;
        Ok(self)
    }

    /// How long a claimed request's handler, and the storing of its response, may go
    /// on once its response future was dropped (the client went away, or an outer
    /// timeout gave up on it): within it, the handler finishes and a retry is replayed;
    /// past it, the handler is stopped where it is and the key freed, so a retry runs
    /// again. Bounds what a handler that never finishes holds (its task, its key, which
    /// would answer 409 for as long as the task renewed it). Default 60 s.
    ///
    /// ```
    /// # fn demo(store: lock_core::IdempotencyStore) {
    /// use std::time::Duration;
    /// use lock_tower::idempotency::IdempotencyLayer;
    ///
    /// let layer = IdempotencyLayer::new(store).detached_limit(Duration::from_secs(300));
    /// # let _ = layer; }
    /// ```
    pub fn detached_limit(mut self, limit: Duration) -> Self {
        self.settings.detached_limit = limit;
        self
    }

    /// How long a duplicate waits for the request in flight to finish, then replays
    /// its response (or runs itself if that one freed the key). Waiters are woken by
    /// pub/sub. Default zero: 409 with `Retry-After` at once.
    pub fn wait_in_flight(mut self, wait: Duration) -> Self {
        self.settings.wait = wait;
        self
    }

    /// `true`: 5xx responses are stored and replayed like any other. Default `false`:
    /// they are not stored and the key is freed, so a retry runs again.
    pub fn store_server_errors(mut self, store: bool) -> Self {
        self.settings.store_server_errors = store;
        self
    }

    /// Which statuses are stored (and replayed); the others free the key, so a retry
    /// runs again. Default [`stored_by_default`](super::stored_by_default): every status but 408, 425 and 429.
    /// 5xx statuses are not asked about: [`store_server_errors`](Self::store_server_errors)
    /// decides those.
    ///
    /// Whatever this says, a refusal (4xx, 5xx) carrying `Retry-After` is never stored:
    /// it tells the client to come back, and a replay would repeat the refusal after the
    /// condition passed (a 409 "busy", a 403 "the sale has not begun"). A success or a
    /// redirect with `Retry-After` (a 202 whose job is polled later) is stored as usual.
    ///
    /// ```
    /// # fn demo(store: lock_core::IdempotencyStore) {
    /// use lock_tower::idempotency::IdempotencyLayer;
    ///
    /// // Only successes are replayed; every refusal runs again on a retry.
    /// let layer = IdempotencyLayer::new(store).store_status(|s| s.is_success());
    /// # let _ = layer; }
    /// ```
    pub fn store_status(mut self, stored: fn(StatusCode) -> bool) -> Self {
        self.settings.store_status = stored;
        self
    }

    /// Adds response headers never stored (hence never replayed), besides the
    /// hop-by-hop ones. Default list: `set-cookie`; this adds to it (use
    /// [`replace_deny_headers`](Self::replace_deny_headers) to start from nothing).
    ///
    /// ```
    /// # fn demo(store: lock_core::IdempotencyStore) {
    /// use http::HeaderName;
    /// use lock_tower::idempotency::IdempotencyLayer;
    ///
    /// // Neither `set-cookie` nor `x-session-token` is replayed.
    /// let layer = IdempotencyLayer::new(store)
    ///     .deny_headers([HeaderName::from_static("x-session-token")]);
    /// # let _ = layer; }
    /// ```
    pub fn deny_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        for name in names {
            if !self.settings.deny_headers.contains(&name) {
                self.settings.deny_headers.push(name);
            }
        }
        self
    }

    /// Replaces the whole deny list (including the default `set-cookie`) with `names`.
    pub fn replace_deny_headers(mut self, names: impl IntoIterator<Item = HeaderName>) -> Self {
        self.settings.deny_headers = names.into_iter().collect();
        self
    }

    /// `true`: keyed requests without a principal share one anonymous scope per method
    /// and path, so only the secrecy of their keys separates their callers. Default
    /// `false`: such a request gets 400 `idempotency-principal-missing`, so an app that
    /// authenticates by something the principal does not read (a cookie, with the
    /// default [`AuthorizationHash`]) cannot replay one user's response to another:
    /// choose a [`principal`](Self::principal) that reads it, or allow anonymous keys
    /// for a service whose clients are all anonymous.
    pub fn allow_anonymous(mut self, allow: bool) -> Self {
        self.settings.allow_anonymous = allow;
        self
    }

    /// When Redis cannot be asked: `true` (the default) answers 503 (fail closed);
    /// `false` runs the request unprotected and logs a warning (fail open).
    pub fn fail_closed(mut self, fail_closed: bool) -> Self {
        self.settings.fail_closed = fail_closed;
        self
    }
}

impl<S, K: Clone, P: Clone> Layer<S> for IdempotencyLayer<K, P> {
    type Service = IdempotencyService<S, K, P>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService {
            inner,
            shared: Arc::new(Shared {
                settings: Arc::new(self.settings.clone()),
                extractor: self.extractor.clone(),
                principal: self.principal.clone(),
            }),
        }
    }
}
