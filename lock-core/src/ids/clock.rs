//! The clock gate: the seconds field of the next id, and what a clock that stepped back
//! costs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::MAX_SECONDS;
use crate::error::LockError;

/// The system clock, since the Unix epoch (zero if it is set before 1970).
pub(super) fn system_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// What to do with a clock reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClockStep {
    /// Issue with this seconds field.
    Go(u32),
    /// The clock is behind the last issued second by this much: sleep, then read again.
    Wait(Duration),
}

/// Decides on a clock reading `now` (since the Unix epoch) given the seconds field of the
/// last id issued, how long this call has waited already and the bound on waiting.
pub(super) fn clock_step(
    now: Duration,
    epoch: u64,
    last_secs: u32,
    waited: Duration,
    max_wait: Duration,
) -> Result<ClockStep, LockError> {
    let Some(since) = now.checked_sub(Duration::from_secs(epoch)) else {
        return Err(LockError::IdsUnavailable(format!(
            "the system clock ({} s since 1970) is before the id epoch ({epoch}); fix the \
             clock, or choose an earlier epoch with IdConfig::with_epoch",
            now.as_secs()
        )));
    };
    let secs = since.as_secs();
    if secs > u64::from(MAX_SECONDS) {
        return Err(LockError::IdsUnavailable(format!(
            "the 31-bit seconds field ran out: the id epoch {epoch} is more than 68 years \
             ago; move to a new generator name with a later epoch"
        )));
    }
    if secs >= u64::from(last_secs) {
        return Ok(ClockStep::Go(secs as u32));
    }
    let behind = Duration::from_secs(u64::from(last_secs)) - since;
    if waited + behind > max_wait {
        return Err(LockError::IdsUnavailable(format!(
            "the system clock stepped back by {behind:?} (after waiting {waited:?}); ids \
             are not issued below the last issued second, and IdConfig::with_max_clock_wait \
             allows {max_wait:?}: retry once the clock has caught up, or raise that bound"
        )));
    }
    Ok(ClockStep::Wait(behind))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::DEFAULT_EPOCH;

    const E: u64 = DEFAULT_EPOCH;

    fn at(unix_secs: u64, millis: u64) -> Duration {
        Duration::from_secs(unix_secs) + Duration::from_millis(millis)
    }

    #[test]
    fn the_clock_moving_forward_goes() {
        let max = Duration::from_secs(2);
        let step = clock_step(at(E + 100, 999), E, 99, Duration::ZERO, max).unwrap();
        assert_eq!(step, ClockStep::Go(100));
        // The same second as the last id is fine: the sequence keeps them apart.
        let step = clock_step(at(E + 100, 0), E, 100, Duration::ZERO, max).unwrap();
        assert_eq!(step, ClockStep::Go(100));
    }

    #[test]
    fn a_clock_stepping_back_waits_then_fails_past_the_bound() {
        let max = Duration::from_secs(2);
        // 500 ms behind the start of the last issued second: wait exactly that.
        let step = clock_step(at(E + 99, 500), E, 100, Duration::ZERO, max).unwrap();
        assert_eq!(step, ClockStep::Wait(Duration::from_millis(500)));
        // Still behind after waiting: waits again, while the total stays in the bound.
        let step = clock_step(at(E + 99, 900), E, 100, Duration::from_millis(500), max).unwrap();
        assert_eq!(step, ClockStep::Wait(Duration::from_millis(100)));
        // A step bigger than the bound fails at once, and says what to do.
        let e = clock_step(at(E + 90, 0), E, 100, Duration::ZERO, max).unwrap_err();
        assert!(e.is_ids_unavailable(), "{e:?}");
        assert!(e.to_string().contains("stepped back by 10s"), "{e}");
        assert!(e.to_string().contains("with_max_clock_wait"), "{e}");
        // The bound counts what was waited already.
        let e = clock_step(at(E + 99, 0), E, 100, Duration::from_millis(1500), max);
        assert!(e.unwrap_err().is_ids_unavailable());
        // A zero bound never waits.
        let e = clock_step(at(E + 99, 999), E, 100, Duration::ZERO, Duration::ZERO);
        assert!(e.unwrap_err().is_ids_unavailable());
    }

    #[test]
    fn clocks_outside_the_31_bit_range_fail() {
        let max = Duration::from_secs(2);
        let e = clock_step(at(E - 1, 0), E, 0, Duration::ZERO, max).unwrap_err();
        assert!(e.to_string().contains("before the id epoch"), "{e}");
        let last = at(E + u64::from(MAX_SECONDS), 999);
        assert_eq!(
            clock_step(last, E, 0, Duration::ZERO, max).unwrap(),
            ClockStep::Go(MAX_SECONDS)
        );
        let e = clock_step(
            at(E + u64::from(MAX_SECONDS) + 1, 0),
            E,
            0,
            Duration::ZERO,
            max,
        );
        assert!(e.unwrap_err().to_string().contains("31-bit"));
    }
}
