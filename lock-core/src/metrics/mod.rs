//! Metrics through the [`metrics`](https://docs.rs/metrics) facade, behind the `metrics`
//! cargo feature: this crate records, the exporter (Prometheus, StatsD, ...) is yours.
//!
//! Every name, label and description lives here. Labels come from fixed sets, so the
//! number of series stays bounded: never a lock name, key or owner.
//!
//! | metric | kind | labels |
//! | --- | --- | --- |
//! | `lock_acquisitions_total` | counter | `store`, `primitive`, `outcome`: `granted`, `reentered`, `busy`, `timed_out`, `error` |
//! | `lock_wait_seconds` | histogram | `store`, `primitive`: from the call to granted, busy or timed out |
//! | `lock_hold_seconds` | histogram | `store`, `primitive`: from the grant to the release of its last hold |
//! | `lock_releases_total` | counter | `store`, `primitive`, `result`: `unlocked`, `still_held`, `expired`, `not_owner`, `error` |
//! | `lock_renewals_total` | counter | `store`, `result`: `renewed`, `expired`, `not_owner`, `error` |
//! | `lock_renewal_seconds` | histogram | `store`: one renewal call (a batch of locks; on a Redlock, one call to each node at once) |
//! | `lock_lost_total` | counter | `store`, `primitive` |
//! | `rate_limit_decisions_total` | counter | `outcome`: `allowed`, `limited`, `failed_open`, `failed_closed` |
//! | `idempotency_outcomes_total` | counter | `outcome`: `new`, `replayed`, `in_flight`, `mismatch`, `unavailable` |
//!
//! `store` is one of `redis`, `redis_cluster`, `redlock`, `zookeeper`, `mysql`,
//! `postgres`, `etcd`, `memory`. `primitive` is what the hold is for: `lock` (a plain
//! lock), `fair_lock` (a fair lock), `read_lock` and `write_lock` (the holds of a
//! read-write lock), `election` (a candidate's campaign and leadership). Renewals are batched across primitives, so
//! they are counted by store alone.
//!
//! What counts as one event:
//! - An acquisition is counted once, when the call returns (a wait that retries is one
//!   acquisition); a future dropped before it returns is not counted. A re-entry of a
//!   lock the scope already holds is `reentered`, not `granted`, and its release is
//!   `still_held` unless it was the last hold.
//! - A dropped guard's background release is counted with its result, on every store;
//!   so is a release sent again in the background after Redis did not answer it (once,
//!   with the last try's result, not the error its caller got).
//! - A [`Redlock`](crate::Redlock) counts everything once per Redlock grant, under
//!   `redlock` (its node copies are not counted on their own; one lost copy is not
//!   yet a lost Redlock).
//! - Renewals are the watchdog's (on Redis and Redlock) and the session checks of the
//!   database stores; [`LockGuard::extend`](crate::LockGuard::extend) is not counted.
//! - Losses are counted once per grant, when the client learns of them (a renewal or
//!   release that finds another grant or none, the lease running out by the watchdog's
//!   clock, or a session store reporting it); a fixed lease of the in-memory store,
//!   which has no watchdog, is counted when the grant is next released or re-entered.
//! - Rate-limit decisions are those of [`RateLimiter::check`](crate::RateLimiter::check)
//!   and [`RuleLimiter::try_access`](crate::RuleLimiter::try_access) (a peek decides
//!   nothing); `failed_open` and `failed_closed` are recorded by `lock-tower`'s layer
//!   when Redis could not decide.
//! - Idempotency outcomes are those of
//!   [`IdempotencyStore::begin_or_wait`](crate::IdempotencyStore::begin_or_wait), one
//!   per call; `unavailable` is a Redis error, other errors (a bad key) are not counted.
//!
//! With the feature off every function here is an empty `#[inline]` function.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lock_core::LockError> {
//! // With an exporter installed as the global recorder (e.g. metrics-exporter-prometheus):
//! lock_core::metrics::describe(); // once: descriptions and units for the exporter
//! let client = lock_core::LockClient::open("redis://127.0.0.1:6379/").await?;
//! let guard = client.lock("nightly-report").await?;
//! // lock_acquisitions_total{store="redis",outcome="granted"} is now 1
//! guard.release().await?;
//! // lock_releases_total{store="redis",result="unlocked"} and lock_hold_seconds too
//! # Ok(()) }
//! ```

use tokio::time::Instant;

use crate::error::LockError;

/// Acquisitions by store and outcome.
pub const ACQUISITIONS: &str = "lock_acquisitions_total";
/// Time from an acquisition call to its outcome (granted, busy or timed out).
pub const WAIT: &str = "lock_wait_seconds";
/// Time from a grant to the release of its last hold.
pub const HOLD: &str = "lock_hold_seconds";
/// Releases by store and result.
pub const RELEASES: &str = "lock_releases_total";
/// Renewals by store and result.
pub const RENEWALS: &str = "lock_renewals_total";
/// Latency of one renewal call.
pub const RENEWAL_LATENCY: &str = "lock_renewal_seconds";
/// Locks lost (taken over or expired while held), by store.
pub const LOST: &str = "lock_lost_total";
/// Rate-limit decisions by outcome.
pub const RATE_LIMIT_DECISIONS: &str = "rate_limit_decisions_total";
/// Idempotency-key lookups by outcome.
pub const IDEMPOTENCY_OUTCOMES: &str = "idempotency_outcomes_total";

/// Registers the description and unit of every metric above with the installed
/// recorder (call it once, after installing the exporter as the global recorder).
/// From then on, lock-core keeps each series' handle once registered with the global
/// recorder instead of registering it on every event (a local recorder is still asked
/// every time). A no-op without the `metrics` feature.
#[inline]
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        use metrics::{Unit, describe_counter, describe_histogram};
        for (name, description) in [
            (ACQUISITIONS, "Lock acquisitions by store and outcome."),
            (RELEASES, "Lock releases by store and result."),
            (RENEWALS, "Lock lease renewals by store and result."),
            (LOST, "Locks lost while held, by store."),
            (RATE_LIMIT_DECISIONS, "Rate-limit decisions by outcome."),
            (IDEMPOTENCY_OUTCOMES, "Idempotency-key lookups by outcome."),
        ] {
            describe_counter!(name, description);
        }
        // Every histogram is a duration.
        for (name, description) in [
            (
                WAIT,
                "Time from a lock acquisition call to granted, busy or timed out.",
            ),
            (
                HOLD,
                "Time from a lock grant to the release of its last hold.",
            ),
            (RENEWAL_LATENCY, "Latency of one lease renewal call."),
        ] {
            describe_histogram!(name, Unit::Seconds, description);
        }
        record::keep_handles();
    }
}

/// Where a lock lives: the `store` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StoreKind {
    Redis,
    RedisCluster,
    Redlock,
    Memory,
    #[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
    Zookeeper,
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Mysql,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres,
    #[cfg_attr(not(feature = "etcd"), allow(dead_code))]
    Etcd,
}

impl StoreKind {
    /// Every kind, in declaration order (`kind as usize` indexes it).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 8] = [
        Self::Redis,
        Self::RedisCluster,
        Self::Redlock,
        Self::Memory,
        Self::Zookeeper,
        Self::Mysql,
        Self::Postgres,
        Self::Etcd,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const fn label(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::RedisCluster => "redis_cluster",
            Self::Redlock => "redlock",
            Self::Memory => "memory",
            Self::Zookeeper => "zookeeper",
            Self::Mysql => "mysql",
            Self::Postgres => "postgres",
            Self::Etcd => "etcd",
        }
    }
}

/// What a hold is for: the `primitive` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Primitive {
    #[default]
    Lock,
    FairLock,
    ReadLock,
    WriteLock,
    Election,
}

impl Primitive {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 5] = [
        Self::Lock,
        Self::FairLock,
        Self::ReadLock,
        Self::WriteLock,
        Self::Election,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn label(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::FairLock => "fair_lock",
            Self::ReadLock => "read_lock",
            Self::WriteLock => "write_lock",
            Self::Election => "election",
        }
    }
}

/// The labels every lock metric carries: where the hold lives and what it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Series {
    pub(crate) store: StoreKind,
    pub(crate) primitive: Primitive,
}

impl Series {
    /// Its place in a table of keys built by store, then primitive.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn index(self) -> usize {
        self.store as usize * Primitive::ALL.len() + self.primitive as usize
    }
}

/// How an acquisition ended: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    Granted,
    Reentered,
    Busy,
    TimedOut,
    Error,
}

impl Acquired {
    /// The outcome of a call that returned `result`; `reentered`: its success was a
    /// re-entry.
    pub(crate) fn of<T>(result: &Result<T, LockError>, reentered: bool) -> Self {
        match result {
            Ok(_) if reentered => Self::Reentered,
            Ok(_) => Self::Granted,
            Err(LockError::Busy { .. }) => Self::Busy,
            Err(LockError::Timeout { .. }) => Self::TimedOut,
            Err(_) => Self::Error,
        }
    }

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 5] = [
        Self::Granted,
        Self::Reentered,
        Self::Busy,
        Self::TimedOut,
        Self::Error,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn label(self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Reentered => "reentered",
            Self::Busy => "busy",
            Self::TimedOut => "timed_out",
            Self::Error => "error",
        }
    }
}

/// What a release returned: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseOutcome {
    Unlocked,
    StillHeld,
    Expired,
    NotOwner,
    Error,
}

impl ReleaseOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 5] = [
        Self::Unlocked,
        Self::StillHeld,
        Self::Expired,
        Self::NotOwner,
        Self::Error,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn label(self) -> &'static str {
        match self {
            Self::Unlocked => "unlocked",
            Self::StillHeld => "still_held",
            Self::Expired => "expired",
            Self::NotOwner => "not_owner",
            Self::Error => "error",
        }
    }
}

/// What one lock's renewal found: the `result` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renewal {
    Renewed,
    Expired,
    NotOwner,
    Error,
}

impl Renewal {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 4] = [Self::Renewed, Self::Expired, Self::NotOwner, Self::Error];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn label(self) -> &'static str {
        match self {
            Self::Renewed => "renewed",
            Self::Expired => "expired",
            Self::NotOwner => "not_owner",
            Self::Error => "error",
        }
    }
}

/// A rate-limit decision: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateOutcome {
    Allowed,
    Limited,
    FailedOpen,
    FailedClosed,
}

impl RateOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 4] = [
        Self::Allowed,
        Self::Limited,
        Self::FailedOpen,
        Self::FailedClosed,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn label(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Limited => "limited",
            Self::FailedOpen => "failed_open",
            Self::FailedClosed => "failed_closed",
        }
    }

    pub(crate) const fn of(allowed: bool) -> Self {
        if allowed {
            Self::Allowed
        } else {
            Self::Limited
        }
    }
}

/// An idempotency lookup's outcome: the `outcome` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdempotencyOutcome {
    New,
    Replayed,
    InFlight,
    Mismatch,
    Unavailable,
}

impl IdempotencyOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const ALL: [Self; 5] = [
        Self::New,
        Self::Replayed,
        Self::InFlight,
        Self::Mismatch,
        Self::Unavailable,
    ];

    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    const fn label(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::Mismatch => "mismatch",
            Self::Unavailable => "unavailable",
        }
    }
}

#[cfg(feature = "metrics")]
mod record;

#[cfg(not(feature = "metrics"))]
mod record {
    use std::time::Duration;

    use super::*;

    #[inline]
    pub(crate) fn acquired(_: Series, _: Acquired, _: Instant, _: Option<Instant>) {}
    #[inline]
    pub(crate) fn released(_: Series, _: ReleaseOutcome) {}
    #[inline]
    pub(crate) fn held(_: Series, _: Instant, _: Instant) {}
    #[inline]
    pub(crate) fn renewed(_: StoreKind, _: Renewal, _: u64) {}
    #[inline]
    pub(crate) fn renewal_call(_: StoreKind, _: Duration) {}
    #[inline]
    pub(crate) fn lost(_: Series) {}
    #[inline]
    pub(crate) fn rate_limit(_: RateOutcome) {}
    #[inline]
    pub(crate) fn idempotency(_: IdempotencyOutcome) {}
}

pub(crate) use record::{
    acquired, held, idempotency, lost, rate_limit, released, renewal_call, renewed,
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorder indexes its key tables by `variant as usize`.
    #[test]
    fn every_label_list_is_in_declaration_order() {
        fn in_order<T: Copy + std::fmt::Debug>(all: &[T], index: fn(T) -> usize) {
            for (i, v) in all.iter().enumerate() {
                assert_eq!(index(*v), i, "{v:?}");
            }
        }
        in_order(&StoreKind::ALL, |v| v as usize);
        in_order(&Primitive::ALL, |v| v as usize);
        in_order(&Acquired::ALL, |v| v as usize);
        in_order(&ReleaseOutcome::ALL, |v| v as usize);
        in_order(&Renewal::ALL, |v| v as usize);
        in_order(&RateOutcome::ALL, |v| v as usize);
        in_order(&IdempotencyOutcome::ALL, |v| v as usize);
    }
}
