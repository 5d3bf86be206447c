//! What kind of failure a [`LockError`] is, for code that answers someone (an HTTP
//! server, an RPC handler, a CLI's exit code). lock-core only classifies; rendering is
//! the caller's (lock-tower's `problem::Problem` writes problem+json from this).

use std::time::Duration;

use crate::error::LockError;

/// What kind of failure a [`LockError`] is: what its caller should be told
/// ([`LockError::class`] has the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// Another owner holds the lock, or the wait for it ran out: the same call may
    /// succeed later (HTTP: 409 Conflict).
    Busy,
    /// The lock was lost while held: expired or taken over (HTTP: 409 Conflict).
    Lost,
    /// The caller's input was refused, e.g. a malformed key (HTTP: 400 Bad Request).
    InvalidInput,
    /// The store (Redis, a Redlock quorum, another store) or the id generator is
    /// unreachable or failing: retry later (HTTP: 503 Service Unavailable).
    Unavailable,
    /// The server's own configuration is wrong; a retry will not help (HTTP: 500).
    Misconfigured,
}

impl LockError {
    /// The class of this error:
    ///
    /// | error | class | code | retry after |
    /// | --- | --- | --- | --- |
    /// | `Busy` | `Busy` | `lock-busy` | the holder's remaining lease |
    /// | `Timeout` | `Busy` | `lock-wait-timeout` | 1 s |
    /// | `NotOwner`, `Expired` | `Lost` | `lock-lost` | none |
    /// | `InvalidKey` | `InvalidInput` | `invalid-lock-key` | none |
    /// | store unavailable ([`is_unavailable`](Self::is_unavailable)) | `Unavailable` | `lock-service-unavailable` | 1 s |
    /// | `IdsUnavailable` | `Unavailable` | `ids-unavailable` | 1 s |
    /// | anything else (a configuration mistake) | `Misconfigured` | `lock-misconfigured` | none |
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_core::{ErrorClass, LockError};
    ///
    /// let e = LockError::Busy { key: "order:7".into(), retry_after: Duration::from_millis(1500) };
    /// assert_eq!(e.class(), ErrorClass::Busy);
    /// assert_eq!(e.code(), "lock-busy");
    /// assert_eq!(e.retry_after(), Some(Duration::from_millis(1500)));
    /// ```
    pub fn class(&self) -> ErrorClass {
        match self {
            Self::Busy { .. } | Self::Timeout { .. } => ErrorClass::Busy,
            Self::NotOwner { .. } | Self::Expired { .. } => ErrorClass::Lost,
            Self::InvalidKey(_) => ErrorClass::InvalidInput,
            e if e.is_unavailable() || e.is_ids_unavailable() => ErrorClass::Unavailable,
            _ => ErrorClass::Misconfigured,
        }
    }

    /// A stable kebab-case name of this error's case (see [`class`](Self::class)), for
    /// problem `type`s, metrics and logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "lock-busy",
            Self::Timeout { .. } => "lock-wait-timeout",
            Self::NotOwner { .. } | Self::Expired { .. } => "lock-lost",
            Self::InvalidKey(_) => "invalid-lock-key",
            Self::IdsUnavailable(_) => "ids-unavailable",
            e if e.is_unavailable() => "lock-service-unavailable",
            _ => "lock-misconfigured",
        }
    }

    /// When the same call may succeed: the holder's remaining lease for
    /// [`Busy`](Self::Busy), 1 s for a wait that timed out and for an unavailable store
    /// or id generator; `None` when a retry will not help by itself.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { retry_after, .. } => Some(*retry_after),
            _ if self.class() == ErrorClass::Busy => Some(Duration::from_secs(1)),
            _ if self.class() == ErrorClass::Unavailable => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_codes_and_retry_after() {
        let timeout = LockError::Timeout {
            key: "k".into(),
            waited: Duration::from_secs(2),
        };
        assert_eq!(
            (timeout.class(), timeout.code(), timeout.retry_after()),
            (
                ErrorClass::Busy,
                "lock-wait-timeout",
                Some(Duration::from_secs(1))
            )
        );
        let down = LockError::RedisTimeout {
            op: "acquire",
            after: Duration::from_secs(2),
        };
        assert_eq!(down.class(), ErrorClass::Unavailable);
        assert_eq!(down.code(), "lock-service-unavailable");
        let store = LockError::Store {
            store: "postgres",
            message: "connection refused".into(),
        };
        assert_eq!(
            (store.class(), store.retry_after()),
            (ErrorClass::Unavailable, Some(Duration::from_secs(1)))
        );
        let ids = LockError::IdsUnavailable("clock stepped back".into());
        assert_eq!(
            (ids.class(), ids.code()),
            (ErrorClass::Unavailable, "ids-unavailable")
        );
        let key = LockError::InvalidKey("part 1 is empty".into());
        assert_eq!(
            (key.class(), key.retry_after()),
            (ErrorClass::InvalidInput, None)
        );
        let conf = LockError::InvalidConfig("no global client".into());
        assert_eq!(
            (conf.class(), conf.code()),
            (ErrorClass::Misconfigured, "lock-misconfigured")
        );
    }
}
