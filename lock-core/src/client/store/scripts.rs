//! Every Lua script of the crate, loaded from the workspace's `lua/` folder, and the
//! typed replies of the lock scripts.
//!
//! The lock scripts (acquire, release, renew, fence, fenced write) and the batched
//! scripts (GCRA, idempotency begin and complete) run through [`Lua`] and
//! [`Conn::eval`](super::Conn::eval): EVALSHA, and EVAL of the source on a NOSCRIPT
//! reply (after a server restart or `SCRIPT FLUSH`). The batched ones (acquire,
//! release, GCRA, idempotency begin and complete) take any number of entries and answer
//! one reply per entry (see [`super::batch`]). They share one reply convention,
//! decoded in one place ([`Code`]): a code first, then a value:
//! `1` done, `0` busy, `-1` expired (no such lock), `-2` not owner (another grant).
//! The other scripts run through [`redis::Script`] (EVALSHA, loading on NOSCRIPT).
//!
//! Every script starts with the Redis 7 shebang `#!lua`: Redis runs such scripts about
//! a fifth faster than flag-less legacy scripts, and requires them to name every key in
//! KEYS. This is why Redis 7.0 or newer is required. A shebang script is refused while
//! the server is out of memory (at `maxmemory` under `noeviction`, the policy this
//! crate requires), right for the scripts that write. The scripts that only give back
//! or keep what is held (release, renew, a read-write lock's extension and release, an
//! idempotency claim's abandon and extend, a semaphore's release and extension, a fair waiter's
//! leave) start `#!lua flags=allow-oom`: a full server still frees locks and keeps the
//! held ones alive, instead of leaving them to their leases and losing them. Such a
//! script may run any command while full, so it calls only commands that free memory or
//! leave it as it is (a unit test holds every script with the flag to that). A script
//! that only reads (a semaphore's count) says `#!lua flags=no-writes`: Redis refuses its
//! writes and runs it on a full server.

use redis::{Script, Value};

use crate::error::LockError;

/// A lock script: its source and SHA1, computed once.
pub(crate) struct Lua {
    op: &'static str,
    source: &'static str,
    /// Keys per entry of a batched script (0 for the others).
    entry_keys: usize,
    /// How a batch lays out its entries' keys (a batched script's header says which).
    layout: Layout,
    sha: std::sync::OnceLock<String>,
}

impl Lua {
    const fn new(op: &'static str, source: &'static str) -> Self {
        Self::batched(op, source, 0)
    }

    /// A batched script whose entries have `entry_keys` keys each (its header's
    /// layout): a call alone writes its command directly, `numkeys` first.
    const fn batched(op: &'static str, source: &'static str, entry_keys: usize) -> Self {
        Self {
            op,
            source,
            entry_keys,
            layout: Layout::Rows,
            sha: std::sync::OnceLock::new(),
        }
    }

    /// A batched script whose keys come a column at a time ([`Layout::Columns`]).
    const fn batched_by_column(op: &'static str, source: &'static str, entry_keys: usize) -> Self {
        Self {
            op,
            source,
            entry_keys,
            layout: Layout::Columns,
            sha: std::sync::OnceLock::new(),
        }
    }

    pub(crate) fn entry_keys(&self) -> usize {
        self.entry_keys
    }

    /// How many keys a batch's key columns hold: the keys per entry for a script laid
    /// out by column, 1 (one column of every key, entry after entry) for the others.
    pub(crate) fn key_columns(&self) -> usize {
        match self.layout {
            Layout::Rows => 1,
            Layout::Columns => self.entry_keys.max(1),
        }
    }

    pub(crate) fn op(&self) -> &'static str {
        self.op
    }

    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    pub(crate) fn sha(&self) -> &str {
        self.sha
            .get_or_init(|| Script::new(self.source).get_hash().to_owned())
    }
}

/// Where a batched script finds entry i's keys in KEYS (arguments are always entry
/// after entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Entry after entry: entry i's k keys are KEYS[k(i-1)+1 .. ki].
    Rows,
    /// A column at a time: every entry's first key, then every entry's second, and so
    /// on, so that entry i's j-th key of n entries is KEYS[(j-1)n + i]. A script can then
    /// hand one kind of key of the whole batch to one command (`MGET`, `DEL`) with
    /// `unpack(KEYS, from, to)`, where rows would need a table built key by key.
    Columns,
}

/// Take a lock with a fresh grant. See `lua/acquire.lua`.
pub(crate) static ACQUIRE: Lua =
    Lua::batched("acquire", include_str!("../../../lua/acquire.lua"), 3);
/// Give back one grant. See `lua/release.lua`.
pub(crate) static RELEASE: Lua =
    Lua::batched_by_column("release", include_str!("../../../lua/release.lua"), 3);
/// Take a fair lock in its line's order. See `lua/fair.lua`.
pub(crate) static FAIR: Lua = Lua::new("fair", include_str!("../../../lua/fair.lua"));
/// Leave a fair lock's line. See `lua/fair_leave.lua`.
pub(crate) static FAIR_LEAVE: Lua =
    Lua::new("fair_leave", include_str!("../../../lua/fair_leave.lua"));
/// The token of a grant taken without one. See `lua/fence.lua`.
pub(crate) static FENCE: Lua = Lua::new("fence", include_str!("../../../lua/fence.lua"));
/// Renew one or many leases. See `lua/renew.lua`.
pub(crate) static RENEW: Lua = Lua::new("renew", include_str!("../../../lua/renew.lua"));
/// Take a hold of a read-write lock. See `lua/read_write.lua`.
pub(crate) static READ_WRITE: Lua =
    Lua::batched("read_write", include_str!("../../../lua/read_write.lua"), 3);

/// Lengthen holds of read-write locks. See `lua/read_write_extend.lua`.
pub(crate) static READ_WRITE_EXTEND: Lua = Lua::batched(
    "read_write_extend",
    include_str!("../../../lua/read_write_extend.lua"),
    1,
);
/// Give back a hold of a read-write lock. See `lua/read_write_release.lua`.
pub(crate) static READ_WRITE_RELEASE: Lua = Lua::batched(
    "read_write_release",
    include_str!("../../../lua/read_write_release.lua"),
    1,
);
/// Write guarded by a fencing token and its holder. See `lua/fenced_write.lua`.
pub(crate) static FENCED_WRITE: Lua = Lua::new(
    "fenced_write",
    include_str!("../../../lua/fenced_write.lua"),
);

/// The reply code of the lock scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Code {
    /// Done (granted, released, renewed, written).
    Done,
    /// Another grant holds the lock (acquire only).
    Busy,
    /// The lock no longer exists.
    Expired,
    /// Another grant holds the lock now.
    NotOwner,
}

impl Code {
    fn from_i64(op: &str, code: i64) -> Result<Self, LockError> {
        match code {
            1 => Ok(Self::Done),
            0 => Ok(Self::Busy),
            -1 => Ok(Self::Expired),
            -2 => Ok(Self::NotOwner),
            _ => Err(unexpected(op, &code)),
        }
    }
}

fn unexpected(op: &str, what: &dyn std::fmt::Debug) -> LockError {
    LockError::UnexpectedReply(format!("{op}.lua returned {what:?}"))
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// `{code, value}`, `{code}` or a bare code: the code and the value (0 when absent).
pub(crate) fn code_value(op: &str, reply: Value) -> Result<(Code, i64), LockError> {
    if let Value::Int(c) = reply {
        return Ok((Code::from_i64(op, c)?, 0));
    }
    if let Value::Array(items) = &reply {
        match items.as_slice() {
            [c] => {
                if let Some(c) = int(c) {
                    return Ok((Code::from_i64(op, c)?, 0));
                }
            }
            [c, v] => {
                if let (Some(c), Some(v)) = (int(c), int(v)) {
                    return Ok((Code::from_i64(op, c)?, v));
                }
            }
            _ => {}
        }
    }
    Err(unexpected(op, &reply))
}

/// `{code, ...}` with exactly `n` codes (a batched script's reply).
pub(crate) fn codes(op: &str, reply: Value, n: usize) -> Result<Vec<Code>, LockError> {
    if let Value::Array(items) = &reply
        && items.len() == n
    {
        return items
            .iter()
            .map(|v| int(v).ok_or_else(|| unexpected(op, &reply)))
            .map(|c| c.and_then(|c| Code::from_i64(op, c)))
            .collect();
    }
    Err(unexpected(op, &reply))
}

/// What `acquire.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireReply {
    Granted {
        token: Option<u64>,
    },
    /// The holder's PTTL: -1 for a key without expiry.
    Busy {
        pttl_ms: i64,
    },
}

impl AcquireReply {
    pub(crate) fn decode(reply: Value) -> Result<Self, LockError> {
        match code_value("acquire", reply)? {
            // Token 0: granted without one (not asked for).
            (Code::Done, token) if token >= 0 => Ok(Self::Granted {
                token: (token > 0).then_some(token as u64),
            }),
            (Code::Busy, pttl_ms) => Ok(Self::Busy { pttl_ms }),
            other => Err(unexpected("acquire", &other)),
        }
    }
}

/// What `fenced_write.lua` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FencedWriteReply {
    Written,
    /// A newer token, or the same from another holder, came first.
    Refused {
        newest: u64,
        holder: u64,
    },
}

impl FencedWriteReply {
    pub(crate) fn decode(reply: Value) -> Result<Self, LockError> {
        // `{-2, newest, holder}`: the holder id travels as a string (Lua numbers
        // cannot hold 64 bits).
        if let Value::Array(items) = &reply
            && let [code, newest, holder] = items.as_slice()
        {
            let refused = (int(code) == Some(-2))
                .then(|| Some((u64::try_from(int(newest)?).ok()?, u64_of(holder)?)))
                .flatten();
            return match refused {
                Some((newest, holder)) => Ok(Self::Refused { newest, holder }),
                None => Err(unexpected("fenced_write", &reply)),
            };
        }
        match code_value("fenced_write", reply)? {
            (Code::Done, _) => Ok(Self::Written),
            other => Err(unexpected("fenced_write", &other)),
        }
    }
}

fn u64_of(v: &Value) -> Option<u64> {
    redis::FromRedisValue::from_redis_value_ref(v).ok()
}

/// What `release.lua` (and one entry of `renew.lua`) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantReply {
    Done,
    Expired,
    NotOwner,
}

impl GrantReply {
    pub(crate) fn from_code(op: &str, code: Code) -> Result<Self, LockError> {
        match code {
            Code::Done => Ok(Self::Done),
            Code::Expired => Ok(Self::Expired),
            Code::NotOwner => Ok(Self::NotOwner),
            Code::Busy => Err(unexpected(op, &code)),
        }
    }

    pub(crate) fn decode(op: &str, reply: Value) -> Result<Self, LockError> {
        let (code, _) = code_value(op, reply)?;
        Self::from_code(op, code)
    }
}

/// The reply of `fence.lua`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceReply {
    Token(u64),
    Lost(GrantReply),
}

impl FenceReply {
    pub(crate) fn decode(reply: Value) -> Result<Self, LockError> {
        match code_value("fence", reply)? {
            (Code::Done, token) if token > 0 => Ok(Self::Token(token as u64)),
            (Code::Expired, _) => Ok(Self::Lost(GrantReply::Expired)),
            (Code::NotOwner, _) => Ok(Self::Lost(GrantReply::NotOwner)),
            other => Err(unexpected("fence", &other)),
        }
    }
}

/// GCRA rate-limit decisions. See `lua/gcra.lua`.
pub(crate) static GCRA: Lua = Lua::batched("gcra", include_str!("../../../lua/gcra.lua"), 1);
/// The fixed-window rule with a lockout. See `lua/limit_rule.lua`.
pub(crate) static LIMIT_RULE: Lua =
    Lua::new("limit_rule", include_str!("../../../lua/limit_rule.lua"));
/// Take permits of an expiring semaphore. See `lua/semaphore_acquire.lua`.
pub(crate) static SEMAPHORE_ACQUIRE: Lua = Lua::new(
    "semaphore_acquire",
    include_str!("../../../lua/semaphore_acquire.lua"),
);
/// Count a semaphore's free permits, writing nothing. See `lua/semaphore_available.lua`.
pub(crate) static SEMAPHORE_AVAILABLE: Lua = Lua::new(
    "semaphore_available",
    include_str!("../../../lua/semaphore_available.lua"),
);
/// Give back semaphore permits by id. See `lua/semaphore_release.lua`.
pub(crate) static SEMAPHORE_RELEASE: Lua = Lua::new(
    "semaphore_release",
    include_str!("../../../lua/semaphore_release.lua"),
);
/// Set a new lease on semaphore permits. See `lua/semaphore_extend.lua`.
pub(crate) static SEMAPHORE_EXTEND: Lua = Lua::new(
    "semaphore_extend",
    include_str!("../../../lua/semaphore_extend.lua"),
);
/// The next sequence number of a day's order-id counter. See `lua/next_id.lua`.
pub(crate) static NEXT_ID: Lua = Lua::new("next_id", include_str!("../../../lua/next_id.lua"));
/// Reserve a block of a day's order-id counter. See `lua/reserve_ids.lua`.
pub(crate) static RESERVE_IDS: Lua =
    Lua::new("reserve_ids", include_str!("../../../lua/reserve_ids.lua"));

/// Store the responses of claimed keys. See `lua/idempotency_complete.lua`.
pub(crate) static IDEMPOTENCY_COMPLETE: Lua = Lua::batched(
    "idempotency_complete",
    include_str!("../../../lua/idempotency_complete.lua"),
    1,
);
/// Free a claimed key. See `lua/idempotency_abandon.lua`.
pub(crate) static IDEMPOTENCY_ABANDON: Lua = Lua::new(
    "idempotency_abandon",
    include_str!("../../../lua/idempotency_abandon.lua"),
);

/// Mark an in-flight key as waited for. See `lua/idempotency_wait.lua`.
pub(crate) static IDEMPOTENCY_WAIT: Lua = Lua::new(
    "idempotency_wait",
    include_str!("../../../lua/idempotency_wait.lua"),
);

/// Renew the in-flight lease of a claimed key. See `lua/idempotency_extend.lua`.
pub(crate) static IDEMPOTENCY_EXTEND: Lua = Lua::new(
    "idempotency_extend",
    include_str!("../../../lua/idempotency_extend.lua"),
);

/// A plain or fair lock in Redisson's layout. See `lua/redisson_lock.lua`.
pub(crate) static REDISSON_LOCK: Lua = Lua::new(
    "redisson_lock",
    include_str!("../../../lua/redisson_lock.lua"),
);
/// A read-write lock in Redisson's layout. See `lua/redisson_read_write.lua`.
pub(crate) static REDISSON_READ_WRITE: Lua = Lua::new(
    "redisson_read_write",
    include_str!("../../../lua/redisson_read_write.lua"),
);

/// Source of every script, by file name, for tooling and tests.
pub const SOURCES: &[(&str, &str)] = &[
    ("acquire.lua", include_str!("../../../lua/acquire.lua")),
    ("release.lua", include_str!("../../../lua/release.lua")),
    ("fair.lua", include_str!("../../../lua/fair.lua")),
    (
        "fair_leave.lua",
        include_str!("../../../lua/fair_leave.lua"),
    ),
    ("fence.lua", include_str!("../../../lua/fence.lua")),
    ("renew.lua", include_str!("../../../lua/renew.lua")),
    (
        "read_write.lua",
        include_str!("../../../lua/read_write.lua"),
    ),
    (
        "read_write_extend.lua",
        include_str!("../../../lua/read_write_extend.lua"),
    ),
    (
        "read_write_release.lua",
        include_str!("../../../lua/read_write_release.lua"),
    ),
    (
        "fenced_write.lua",
        include_str!("../../../lua/fenced_write.lua"),
    ),
    (
        "redisson_lock.lua",
        include_str!("../../../lua/redisson_lock.lua"),
    ),
    (
        "redisson_read_write.lua",
        include_str!("../../../lua/redisson_read_write.lua"),
    ),
    ("gcra.lua", include_str!("../../../lua/gcra.lua")),
    (
        "limit_rule.lua",
        include_str!("../../../lua/limit_rule.lua"),
    ),
    (
        "semaphore_acquire.lua",
        include_str!("../../../lua/semaphore_acquire.lua"),
    ),
    (
        "semaphore_available.lua",
        include_str!("../../../lua/semaphore_available.lua"),
    ),
    (
        "semaphore_release.lua",
        include_str!("../../../lua/semaphore_release.lua"),
    ),
    (
        "semaphore_extend.lua",
        include_str!("../../../lua/semaphore_extend.lua"),
    ),
    ("next_id.lua", include_str!("../../../lua/next_id.lua")),
    (
        "reserve_ids.lua",
        include_str!("../../../lua/reserve_ids.lua"),
    ),
    (
        "idempotency_complete.lua",
        include_str!("../../../lua/idempotency_complete.lua"),
    ),
    (
        "idempotency_abandon.lua",
        include_str!("../../../lua/idempotency_abandon.lua"),
    ),
    (
        "idempotency_extend.lua",
        include_str!("../../../lua/idempotency_extend.lua"),
    ),
    (
        "idempotency_wait.lua",
        include_str!("../../../lua/idempotency_wait.lua"),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A batched script's declared keys per entry is what its loop steps by: a call
    /// alone writes that count as `numkeys` before its keys.
    #[test]
    fn batched_scripts_declare_the_keys_of_one_entry() {
        for script in [
            &ACQUIRE,
            &RELEASE,
            &READ_WRITE,
            &READ_WRITE_EXTEND,
            &READ_WRITE_RELEASE,
            &GCRA,
            &IDEMPOTENCY_COMPLETE,
        ] {
            let per_entry = match (script.entry_keys(), script.layout) {
                (1, _) => "for i = 1, #KEYS do".to_string(),
                (n, Layout::Rows) => format!("for i = 1, #KEYS / {n} do"),
                (n, Layout::Columns) => format!("local n = #KEYS / {n}\n"),
            };
            assert!(
                script.source().contains(&per_entry),
                "{}.lua does not loop with `{per_entry}`",
                script.op()
            );
        }
    }

    /// A channel is no key, so the release scripts name it themselves: as the keys do.
    #[test]
    fn the_release_scripts_publish_on_the_lock_keys_channel() {
        use crate::client::store::key::{RELEASED, lock_keys};
        let suffix = format!("lock .. '{RELEASED}'");
        for script in [&RELEASE, &READ_WRITE_RELEASE] {
            assert!(
                script.source().contains(&suffix),
                "{}.lua lacks {suffix}",
                script.op()
            );
        }
        let keys = lock_keys("ns", ":", "a").unwrap();
        assert_eq!(keys.channel(), format!("{}{RELEASED}", keys.key));
    }

    #[test]
    fn replies_decode_by_one_convention() {
        let arr = |v: &[i64]| Value::Array(v.iter().map(|i| Value::Int(*i)).collect());
        assert_eq!(
            AcquireReply::decode(arr(&[1, 7])).unwrap(),
            AcquireReply::Granted { token: Some(7) }
        );
        assert_eq!(
            FenceReply::decode(arr(&[1, 9])).unwrap(),
            FenceReply::Token(9)
        );
        assert_eq!(
            FenceReply::decode(arr(&[-2])).unwrap(),
            FenceReply::Lost(GrantReply::NotOwner)
        );
        assert!(FenceReply::decode(arr(&[0, 1])).is_err());
        assert_eq!(
            AcquireReply::decode(arr(&[0, 250])).unwrap(),
            AcquireReply::Busy { pttl_ms: 250 }
        );
        assert_eq!(
            AcquireReply::decode(arr(&[0, -1])).unwrap(),
            AcquireReply::Busy { pttl_ms: -1 },
            "a key without expiry"
        );
        assert_eq!(
            AcquireReply::decode(arr(&[1, 0])).unwrap(),
            AcquireReply::Granted { token: None }
        );
        assert!(
            AcquireReply::decode(arr(&[1, -3])).is_err(),
            "negative token"
        );
        assert!(AcquireReply::decode(arr(&[-1])).is_err());
        assert_eq!(
            GrantReply::decode("release", arr(&[-2])).unwrap(),
            GrantReply::NotOwner
        );
        assert!(GrantReply::decode("release", arr(&[0])).is_err());
        // A bare code is the code (release.lua answers so).
        assert_eq!(
            GrantReply::decode("release", Value::Int(-1)).unwrap(),
            GrantReply::Expired
        );
        assert!(GrantReply::decode("release", Value::Int(0)).is_err());
        assert!(GrantReply::decode("release", Value::Nil).is_err());
        assert_eq!(
            codes("renew", arr(&[1, -1, -2]), 3).unwrap(),
            [Code::Done, Code::Expired, Code::NotOwner]
        );
        assert!(codes("renew", arr(&[1, 5]), 2).is_err());
        assert_eq!(
            FencedWriteReply::decode(arr(&[1, 7])).unwrap(),
            FencedWriteReply::Written
        );
        let refused = Value::Array(vec![
            Value::Int(-2),
            Value::Int(9),
            Value::BulkString(b"18446744073709551615".to_vec()),
        ]);
        assert_eq!(
            FencedWriteReply::decode(refused).unwrap(),
            FencedWriteReply::Refused {
                newest: 9,
                holder: u64::MAX
            }
        );
        assert!(FencedWriteReply::decode(arr(&[0, 1])).is_err());
        assert!(codes("renew", arr(&[1]), 2).is_err());
    }

    /// The shebang of a script that runs on a full server (see the module docs).
    const ALLOW_OOM: &str = "#!lua flags=allow-oom\n";
    /// The shebang of a script that only reads (Redis refuses its writes, and runs it
    /// on a full server).
    const NO_WRITES: &str = "#!lua flags=no-writes\n";

    #[test]
    fn every_script_documents_keys_argv_and_returns() {
        for (name, src) in super::SOURCES {
            assert!(
                src.starts_with("#!lua\n")
                    || src.starts_with(ALLOW_OOM)
                    || src.starts_with(NO_WRITES),
                "{name}: the Redis 7 script shebang must be \"#!lua\", {ALLOW_OOM:?} or {NO_WRITES:?}"
            );
            let header: String = src
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("--"))
                .collect();
            for word in ["KEYS[", "ARGV[", "Returns"] {
                assert!(header.contains(word), "{name} header lacks {word}");
            }
        }
    }

    /// A script that runs on a full server may call any command there: those with the
    /// flag call only commands that free memory or leave it as it is.
    #[test]
    fn scripts_that_run_when_full_never_grow_the_data() {
        const SHRINK_OR_KEEP: &[&str] = &[
            "GET",
            "MGET",
            "HGET",
            "PTTL",
            "TIME",
            "LINDEX",
            "DEL",
            "HDEL",
            "ZREM",
            "ZREMRANGEBYSCORE",
            "PEXPIRE",
            "PUBLISH",
            "EXISTS",
            "LREM",
            "ZSCORE",
            "ZRANGE",
        ];
        let flagged = super::SOURCES
            .iter()
            .filter(|(_, src)| src.starts_with(ALLOW_OOM));
        for (name, src) in flagged {
            let mut called = 0;
            for call in src.split("redis.").skip(1) {
                let Some(args) = call
                    .strip_prefix("call(")
                    .or_else(|| call.strip_prefix("pcall("))
                else {
                    continue;
                };
                // A command named by a variable could be anything.
                let command = args
                    .strip_prefix('\'')
                    .and_then(|rest| rest.split('\'').next())
                    .unwrap_or_else(|| panic!("{name}: a command that is not a literal"));
                if command == "HSET" {
                    // Overwriting a field it has read (a lease end, as long as the
                    // one it replaces) keeps the hash's size.
                    let field: Vec<&str> = args.splitn(4, ", ").skip(1).take(2).collect();
                    let read = format!("'HGET', {})", field.join(", "));
                    assert!(
                        field.len() == 2 && src.contains(&read),
                        "{name} runs when the server is full, and calls HSET on a field it has not read ({read})"
                    );
                } else if command == "ZADD" {
                    // Only with XX: a new score for a member that is there, none added.
                    let flag = args.split(", ").nth(2);
                    assert_eq!(
                        flag,
                        Some("'XX'"),
                        "{name} runs when the server is full, and calls ZADD without XX"
                    );
                } else {
                    assert!(
                        SHRINK_OR_KEEP.contains(&command),
                        "{name} runs when the server is full, but calls {command}"
                    );
                }
                called += 1;
            }
            assert!(called > 0, "{name}: no redis.call found");
        }
    }

    /// `lua/` is what the package ships: it must hold exactly the library's scripts
    /// (an application's scripts live with the application, e.g. `examples/lua/`).
    #[test]
    fn lua_dir_holds_exactly_the_sources() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".lua"))
            .collect();
        files.sort();
        let mut sources: Vec<String> = super::SOURCES.iter().map(|(n, _)| n.to_string()).collect();
        sources.sort();
        assert_eq!(files, sources, "lua/ and SOURCES disagree");
    }
}
