//! Per-call options resolved against a client's config: the one place a lock
//! request is built, for one deployment and for each node of a Redlock.

use std::sync::Arc;
use std::time::Duration;

use super::options::LockOptions;
use crate::client::config::Lease;
use crate::client::config::{LockConfig, check_lease, check_max_hold};
use crate::client::store::key::{self, LockKeys, LockMode, LockName};
use crate::error::LockError;
use crate::metrics::Primitive;
use crate::owner::LockScope;

/// What the caller wants, resolved against the config.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) keys: Arc<LockKeys>,
    pub(crate) scope: LockScope,
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    /// Take the fencing token with the grant.
    pub(crate) fenced: bool,
    /// Wait in line ([`LockOptions::fair`]).
    pub(crate) fair: bool,
    /// What the store keeps beside the hold ([`LockOptions::value`]).
    pub(crate) value: Option<Arc<[u8]>>,
    /// What the hold is for: the metrics' label.
    pub(crate) primitive: Primitive,
}

/// Options resolved once per call (the scope above all: every node of a Redlock must
/// see the same one); [`request`](Self::request) builds the request for one namespace.
pub(crate) struct Resolved<'c> {
    pub(crate) delimiter: &'c str,
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) scope: LockScope,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) fenced: bool,
    pub(crate) fair: bool,
    pub(crate) mode: LockMode,
    pub(crate) value: Option<Arc<[u8]>>,
    pub(crate) primitive: Primitive,
    /// The wait budget.
    pub(crate) wait: Duration,
}

impl<'c> Resolved<'c> {
    /// Checks `options` and fills what they leave out from `config`.
    pub(crate) fn new(config: &'c LockConfig, options: LockOptions) -> Result<Self, LockError> {
        let delimiter = match options.delimiter {
            Some(d) => {
                key::validate_delimiter(d)?;
                d
            }
            None => &config.delimiter,
        };
        let (lease, watchdog) = match options.lease.unwrap_or(config.lease) {
            Lease::Fixed(d) => {
                check_lease("lease", d)?;
                (d, false)
            }
            Lease::Watchdog => (config.watchdog_lease, true),
        };
        let max_hold = options.max_hold.or(config.max_hold);
        check_max_hold(max_hold)?;
        if options.fenced && !options.mode.is_fenced() {
            return Err(LockError::InvalidConfig(
                "a read hold has no fencing token: take the write hold to write fenced".into(),
            ));
        }
        Ok(Self {
            delimiter,
            lease,
            watchdog,
            scope: options
                .scope
                .or_else(LockScope::current)
                .unwrap_or_default(),
            max_hold,
            fenced: options.fenced,
            fair: options.fair,
            mode: options.mode,
            value: options.value,
            primitive: options.primitive.unwrap_or(match options.mode {
                LockMode::Exclusive if options.fair => Primitive::FairLock,
                LockMode::Exclusive => Primitive::Lock,
                LockMode::Read => Primitive::ReadLock,
                LockMode::Write => Primitive::WriteLock,
            }),
            wait: options.wait.unwrap_or(config.wait),
        })
    }

    /// The request for the lock `name` under `namespace`.
    pub(crate) fn request<N: LockName + ?Sized>(
        &self,
        namespace: &str,
        name: &N,
    ) -> Result<Request, LockError> {
        Ok(Request {
            keys: Arc::new(key::lock_keys(namespace, self.delimiter, name)?.with_mode(self.mode)),
            scope: self.scope.clone(),
            lease: self.lease,
            watchdog: self.watchdog,
            max_hold: self.max_hold,
            fenced: self.fenced,
            fair: self.fair,
            value: self.value.clone(),
            primitive: self.primitive,
        })
    }
}
