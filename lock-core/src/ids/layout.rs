//! The id's bit layout, and the per-day counter keys.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::LockError;

/// The default epoch: 2024-01-01T00:00:00Z, in seconds since the Unix epoch.
pub const DEFAULT_EPOCH: u64 = 1_704_067_200;
/// The largest seconds field (31 bits): about 68 years after the epoch.
pub const MAX_SECONDS: u32 = (1 << 31) - 1;
/// The largest sequence of one day (32 bits).
pub const MAX_SEQUENCE: u32 = u32::MAX;

/// Seconds of one (UTC) day.
pub(super) const SECONDS_PER_DAY: u64 = 86_400;

/// One order id: `0 | 31 bits of seconds since the epoch | 32 bits of sequence`.
///
/// Ordered as the number: by second first, then by sequence. `Display` is the decimal
/// number.
///
/// ```
/// use lock_core::ids::{OrderId, DEFAULT_EPOCH};
///
/// let id = OrderId::from_raw((86_400_u64 << 32) | 7).unwrap();
/// let d = id.decode(DEFAULT_EPOCH);
/// assert_eq!((d.unix_seconds, d.sequence), (DEFAULT_EPOCH + 86_400, 7));
/// assert_eq!(id.to_string(), id.get().to_string());
/// assert!(OrderId::from_raw(1 << 63).is_none()); // the sign bit is always 0
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderId(u64);

impl OrderId {
    /// Builds an id from its parts.
    pub fn from_parts(seconds_since_epoch: u32, sequence: u32) -> Option<Self> {
        (seconds_since_epoch <= MAX_SECONDS)
            .then(|| Self((u64::from(seconds_since_epoch) << 32) | u64::from(sequence)))
    }

    /// Takes a number back as an id; `None` when the sign bit is set (never an id).
    pub fn from_raw(raw: u64) -> Option<Self> {
        (raw >> 63 == 0).then_some(Self(raw))
    }

    /// The id as a number (always below 2^63, so it also fits an `i64` / SQL `BIGINT`).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The 31-bit seconds field.
    pub fn seconds_since_epoch(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The 32-bit sequence field (its day's counter value, from 1).
    pub fn sequence(self) -> u32 {
        self.0 as u32
    }

    /// The time and sequence of the id, for ids made with `epoch` (seconds since the
    /// Unix epoch; [`IdGenerator::decode`](super::IdGenerator::decode) uses the generator's own).
    pub fn decode(self, epoch: u64) -> DecodedId {
        let seconds_since_epoch = self.seconds_since_epoch();
        DecodedId {
            unix_seconds: epoch + u64::from(seconds_since_epoch),
            seconds_since_epoch,
            sequence: self.sequence(),
        }
    }
}

impl fmt::Display for OrderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<OrderId> for u64 {
    fn from(id: OrderId) -> u64 {
        id.0
    }
}

/// The parts of an [`OrderId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DecodedId {
    /// When it was issued, in whole seconds since the Unix epoch (the issuing machine's
    /// clock).
    pub unix_seconds: u64,
    /// The raw seconds field: seconds since the generator's epoch.
    pub seconds_since_epoch: u32,
    /// The sequence number within its UTC day (from 1).
    pub sequence: u32,
}

impl DecodedId {
    /// [`unix_seconds`](Self::unix_seconds) as a [`SystemTime`].
    pub fn time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.unix_seconds)
    }
}

pub(super) fn compose(secs: u32, seq: u32) -> OrderId {
    OrderId((u64::from(secs) << 32) | u64::from(seq))
}

/// The day's sequence is used up.
pub(super) fn exhausted(name: &str, day: u64) -> LockError {
    LockError::IdsUnavailable(format!(
        "the 32-bit sequence of ids `{name}` for {} (UTC) is used up ({MAX_SEQUENCE} ids); \
         new ids are available from {} 00:00 UTC; spread the load over several generator \
         names meanwhile",
        civil_date(day),
        civil_date(day + 1)
    ))
}

/// `<base>:ids:<yyyy-mm-dd>`: the counter of one UTC day.
pub(super) fn day_key(base: &str, day: u64) -> String {
    format!("{base}:ids:{}", civil_date(day))
}

/// `yyyy-mm-dd` of a day number (days since 1970-01-01), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_date(day: u64) -> String {
    let z = day as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::store::key;

    const E: u64 = DEFAULT_EPOCH;

    #[test]
    fn layout_and_decode_round_trip() {
        for (secs, seq) in [(0, 1), (1, 0), (86_399, 42), (MAX_SECONDS, u32::MAX)] {
            let id = OrderId::from_parts(secs, seq).unwrap();
            assert_eq!(id.get() >> 63, 0, "sign bit");
            assert_eq!(id.get(), (u64::from(secs) << 32) | u64::from(seq));
            let d = id.decode(E);
            assert_eq!((d.seconds_since_epoch, d.sequence), (secs, seq));
            assert_eq!(d.unix_seconds, E + u64::from(secs));
            assert_eq!(OrderId::from_raw(id.get()), Some(id));
            assert_eq!(d.time(), UNIX_EPOCH + Duration::from_secs(d.unix_seconds));
        }
        assert!(OrderId::from_parts(MAX_SECONDS + 1, 0).is_none());
        assert!(OrderId::from_raw(u64::MAX).is_none());
        // Ordered by second first, then sequence.
        let a = OrderId::from_parts(10, u32::MAX).unwrap();
        let b = OrderId::from_parts(11, 1).unwrap();
        assert!(a < b);
        assert_eq!(b.to_string(), b.get().to_string());
        assert_eq!(
            i64::try_from(OrderId::from_parts(MAX_SECONDS, u32::MAX).unwrap().get()).ok(),
            Some(i64::MAX)
        );
    }

    #[test]
    fn day_keys_follow_the_utc_day_of_the_seconds() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(DEFAULT_EPOCH / SECONDS_PER_DAY), "2024-01-01");
        assert_eq!(civil_date(19_782), "2024-02-29");
        assert_eq!(civil_date(19_783), "2024-03-01");
        assert_eq!(civil_date(10_957), "2000-01-01");
        assert_eq!(
            day_key("lock:{order}", 19_783),
            "lock:{order}:ids:2024-03-01"
        );
        let keys = key::lock_keys("lock", ":", "order").unwrap();
        assert_eq!(day_key(&keys.key, 19_723), "lock:{order}:ids:2024-01-01");
    }

    #[test]
    fn exhaustion_says_when_ids_come_back() {
        let e = exhausted("order", 19_782);
        assert!(e.is_ids_unavailable());
        let text = e.to_string();
        assert!(
            text.contains("2024-02-29") && text.contains("2024-03-01 00:00 UTC"),
            "{text}"
        );
    }
}
