use std::sync::Arc;

use http::{HeaderName, Method};
use lock_core::OneTimeTokens;
use tower::Layer;

use super::OneTimeTokenService;

/// Settings shared by every request of one layer.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) tokens: OneTimeTokens,
    pub(crate) scope: String,
    pub(crate) header: HeaderName,
    pub(crate) methods: Vec<Method>,
    pub(crate) fail_closed: bool,
}

/// Accepts each server-issued token once; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct OneTimeTokenLayer {
    settings: Settings,
}

impl OneTimeTokenLayer {
    /// Consumes tokens of `tokens` issued for `scope` (the scope passed to
    /// [`OneTimeTokens::issue`]).
    pub fn new(tokens: OneTimeTokens, scope: impl Into<String>) -> Self {
        Self {
            settings: Settings {
                tokens,
                scope: scope.into(),
                header: HeaderName::from_static("one-time-token"),
                methods: vec![Method::POST, Method::PATCH],
                fail_closed: true,
            },
        }
    }

    /// The request header carrying the token. Default `One-Time-Token`.
    pub fn header(mut self, name: HeaderName) -> Self {
        self.settings.header = name;
        self
    }

    /// The methods that must carry a token; others pass through untouched. Default
    /// POST and PATCH.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.settings.methods = methods.into_iter().collect();
        self
    }

    /// When Redis cannot be asked: `true` (the default) answers 503 (fail closed);
    /// `false` lets the request through and logs a warning (fail open).
    pub fn fail_closed(mut self, fail_closed: bool) -> Self {
        self.settings.fail_closed = fail_closed;
        self
    }
}

impl<S> Layer<S> for OneTimeTokenLayer {
    type Service = OneTimeTokenService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OneTimeTokenService {
            inner,
            settings: Arc::new(self.settings.clone()),
        }
    }
}
