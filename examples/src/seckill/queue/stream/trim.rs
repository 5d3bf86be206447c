//! Trimming the orders stream: the entries every consumer group has acknowledged are
//! removed (`XTRIM MINID`), so the stream holds the backlog, not the sale's history
//! (that is in SQLite).

use redis::Value;
use redis::aio::ConnectionManager;

use super::reply::{pairs, text};
use crate::seckill::keys::STREAM;

/// A stream entry id, `ms-seq`, ordered as Redis orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct EntryId(u64, u64);

impl EntryId {
    fn parse(s: &str) -> Option<Self> {
        let (ms, seq) = s.split_once('-')?;
        Some(Self(ms.parse().ok()?, seq.parse().ok()?))
    }

    /// The smallest id above this one.
    fn next(self) -> Self {
        match self.1.checked_add(1) {
            Some(seq) => Self(self.0, seq),
            None => Self(self.0.saturating_add(1), 0),
        }
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.0, self.1)
    }
}

fn odd(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply while trimming",
        what.to_owned(),
    ))
}

/// The oldest entry of `group`'s pending list, if any (`XPENDING` summary form:
/// `[count, smallest, greatest, consumers]`, nil when nothing is pending).
async fn oldest_pending(
    conn: &mut ConnectionManager,
    group: &str,
) -> Result<Option<EntryId>, redis::RedisError> {
    let summary: Value = redis::cmd("XPENDING")
        .arg(STREAM)
        .arg(group)
        .query_async(conn)
        .await?;
    let Value::Array(items) = &summary else {
        return Err(odd(&format!("XPENDING: {summary:?}")));
    };
    match items.get(1) {
        None | Some(Value::Nil) => Ok(None),
        Some(v) => text(v)
            .and_then(|s| EntryId::parse(&s))
            .map(Some)
            .ok_or_else(|| odd(&format!("XPENDING: {summary:?}"))),
    }
}

/// Removes the entries that every consumer group has acknowledged; returns how many.
///
/// Below the bound, every entry was delivered to every group and is in no pending
/// list. The bound is, over all groups, the smaller of the group's oldest pending entry
/// and the id after its last delivered one. The groups are read before their pending
/// lists, so an entry delivered in between lies above the last-delivered id read first
/// and is kept. No group at all (Redis restarted empty): nothing is trimmed.
pub(crate) async fn trim_acknowledged(
    conn: &mut ConnectionManager,
) -> Result<u64, redis::RedisError> {
    let reply: Value = redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(STREAM)
        .query_async(conn)
        .await?;
    let Value::Array(groups) = &reply else {
        return Err(odd(&format!("XINFO GROUPS: {reply:?}")));
    };
    let mut read = Vec::with_capacity(groups.len());
    for g in groups {
        let g = pairs(g).ok_or_else(|| odd("XINFO GROUPS entry"))?;
        let field = |name: &str| g.iter().find(|(k, _)| k == name).and_then(|(_, v)| text(v));
        let name = field("name").ok_or_else(|| odd("XINFO GROUPS name"))?;
        let delivered = field("last-delivered-id")
            .and_then(|s| EntryId::parse(&s))
            .ok_or_else(|| odd("XINFO GROUPS last-delivered-id"))?;
        read.push((name, delivered));
    }
    let mut bound: Option<EntryId> = None;
    for (group, delivered) in read {
        let mut below = delivered.next();
        if let Some(oldest) = oldest_pending(conn, &group).await? {
            below = below.min(oldest);
        }
        bound = Some(bound.map_or(below, |b| b.min(below)));
    }
    let Some(bound) = bound else {
        return Ok(0);
    };
    redis::cmd("XTRIM")
        .arg(STREAM)
        .arg("MINID")
        .arg("=")
        .arg(bound.to_string())
        .query_async(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_ids_parse_order_and_step() {
        let a = EntryId::parse("1700000000000-5").unwrap();
        assert_eq!(a.next().to_string(), "1700000000000-6");
        assert!(a < EntryId::parse("1700000000001-0").unwrap());
        assert!(EntryId::parse("2-0").unwrap() < EntryId::parse("10-0").unwrap());
        assert_eq!(EntryId(3, u64::MAX).next(), EntryId(4, 0));
        for bad in ["", "1", "1-", "-1", "a-b", "1-2-3"] {
            assert_eq!(EntryId::parse(bad), None, "{bad:?}");
        }
    }
}
