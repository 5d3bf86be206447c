//! [`IdMode`] and [`IdConfig`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{DEFAULT_EPOCH, SECONDS_PER_DAY};
use crate::error::LockError;

/// Default block of [`IdMode::Segment`].
pub const DEFAULT_BLOCK: u32 = 10_000;
/// Largest block of [`IdMode::Segment`] (a restart can waste up to one block).
pub const MAX_BLOCK: u32 = 1 << 24;
/// Longest time to live of a day's counter key ([`IdConfig::with_day_key_ttl`]).
const MAX_DAY_KEY_TTL: Duration = Duration::from_secs(3650 * SECONDS_PER_DAY);

/// How an [`IdGenerator`](super::IdGenerator) gets sequence numbers from Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdMode {
    /// One atomic script call (`lua/next_id.lua`, INCR) per id. Nothing is ever wasted;
    /// throughput is one Redis round trip per id.
    PerId,
    /// Reserve `block` sequence numbers per script call (`lua/reserve_ids.lua`, INCRBY)
    /// and hand them out locally; the next block is fetched in the background once 80% of
    /// the current one is used. A crash or restart wastes at most `block` numbers.
    Segment {
        /// Numbers per reservation, 1 to [`MAX_BLOCK`].
        block: u32,
    },
}

impl IdMode {
    /// [`IdMode::Segment`] with [`DEFAULT_BLOCK`] (10 000).
    pub fn segment() -> Self {
        Self::Segment {
            block: DEFAULT_BLOCK,
        }
    }
}

/// Configuration of an [`IdGenerator`](super::IdGenerator).
///
/// Behavior:
/// - Built with `IdConfig::new()` and by-value `with_*` setters; each documents its
///   default. Checked by [`validate`](Self::validate) when the generator is built.
/// - Every generator of one name must use the same epoch (the seconds field means
///   nothing otherwise); the mode may differ between processes.
///
/// ```
/// use std::time::Duration;
/// use lock_core::ids::{IdConfig, IdMode};
///
/// let config = IdConfig::new()
///     .with_mode(IdMode::Segment { block: 5_000 })
///     .with_max_clock_wait(Duration::from_millis(500));
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdConfig {
    pub(super) epoch: u64,
    pub(super) mode: IdMode,
    pub(super) max_clock_wait: Duration,
    pub(super) day_key_ttl: Duration,
}

impl Default for IdConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl IdConfig {
    /// The defaults, as documented on each setter.
    pub fn new() -> Self {
        Self {
            epoch: DEFAULT_EPOCH,
            mode: IdMode::PerId,
            max_clock_wait: Duration::from_secs(2),
            day_key_ttl: Duration::from_secs(2 * SECONDS_PER_DAY),
        }
    }

    /// The epoch the seconds field counts from, in seconds since the Unix epoch.
    /// Default [`DEFAULT_EPOCH`] (2024-01-01T00:00:00Z). Must not be in the future.
    pub fn with_epoch(mut self, unix_seconds: u64) -> Self {
        self.epoch = unix_seconds;
        self
    }

    /// Per-id or segment mode. Default [`IdMode::PerId`].
    pub fn with_mode(mut self, mode: IdMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long `next_id` may wait for a clock that stepped back to pass the last issued
    /// second again; a bigger step fails at once with [`LockError::IdsUnavailable`].
    /// Default 2 s. Zero: never wait.
    pub fn with_max_clock_wait(mut self, wait: Duration) -> Self {
        self.max_clock_wait = wait;
        self
    }

    /// Time to live of each day's counter key, set when the day's first id is issued.
    /// Default 2 days; 1 day to 10 years, whole seconds (a day's counter is a few bytes:
    /// keeping them for years costs little). Machines whose clocks are further apart
    /// than this minus one day could repeat the ids of an expired day.
    pub fn with_day_key_ttl(mut self, ttl: Duration) -> Self {
        self.day_key_ttl = ttl;
        self
    }

    /// The epoch, in seconds since the Unix epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The mode.
    pub fn mode(&self) -> IdMode {
        self.mode
    }

    /// Checks every setting; the error names the one that is off.
    pub fn validate(&self) -> Result<(), LockError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        if self.epoch > now.as_secs() {
            return Err(LockError::InvalidConfig(format!(
                "the id epoch {} is in the future (now {}); choose an earlier one",
                self.epoch,
                now.as_secs()
            )));
        }
        if let IdMode::Segment { block } = self.mode
            && !(1..=MAX_BLOCK).contains(&block)
        {
            return Err(LockError::InvalidConfig(format!(
                "the id block size {block} is outside 1..={MAX_BLOCK}"
            )));
        }
        if self.day_key_ttl < Duration::from_secs(SECONDS_PER_DAY) {
            return Err(LockError::InvalidConfig(format!(
                "the id day key TTL {:?} is shorter than one day",
                self.day_key_ttl
            )));
        }
        if self.day_key_ttl > MAX_DAY_KEY_TTL {
            // Redis would refuse the EXPIRE after the day's counter was created, and
            // that counter would then never expire.
            return Err(LockError::InvalidConfig(format!(
                "the id day key TTL {:?} is longer than 10 years",
                self.day_key_ttl
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked() {
        assert!(IdConfig::new().validate().is_ok());
        let future = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + 3600;
        let bad = [
            IdConfig::new().with_epoch(future),
            IdConfig::new().with_mode(IdMode::Segment { block: 0 }),
            IdConfig::new().with_mode(IdMode::Segment {
                block: MAX_BLOCK + 1,
            }),
            IdConfig::new().with_day_key_ttl(Duration::from_secs(3600)),
            IdConfig::new().with_day_key_ttl(MAX_DAY_KEY_TTL + Duration::from_secs(1)),
            IdConfig::new().with_day_key_ttl(Duration::MAX),
        ];
        for c in bad {
            let e = c.validate().unwrap_err();
            assert!(e.is_invalid_input(), "{c:?}: {e}");
        }
        assert_eq!(
            IdMode::segment(),
            IdMode::Segment {
                block: DEFAULT_BLOCK
            }
        );
    }
}
