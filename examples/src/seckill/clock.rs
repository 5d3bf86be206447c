//! Wall-clock milliseconds and their RFC 3339 form, shared by the HTTP layer and the
//! stores (neither imports the other for it).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Now, in Unix milliseconds (0 if the clock is before 1970).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default()
}

/// Unix milliseconds as RFC 3339 (UTC); empty if out of range.
pub(crate) fn format_ms(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_milliseconds() {
        assert_eq!(format_ms(1_735_689_601_000), "2025-01-01T00:00:01Z");
        assert!(now_ms() > 1_735_689_601_000);
    }
}
