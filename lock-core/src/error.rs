//! The one error type of the crate.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong while taking, keeping or giving back a lock.
///
/// Behavior:
/// - `#[non_exhaustive]`: match the predicates ([`is_busy`](Self::is_busy),
///   [`is_timeout`](Self::is_timeout), ...) rather than every variant.
/// - Contention is not a Redis failure: [`Busy`](Self::Busy) and
///   [`Timeout`](Self::Timeout) say another owner holds the lock; [`Redis`](Self::Redis)
///   says the server could not be reached or answered with an error.
/// - Nothing in this crate panics on a Redis reply or on caller input; such cases end
///   up here.
#[derive(Debug)]
#[non_exhaustive]
pub enum LockError {
    /// `try_lock`: another owner holds the lock. `retry_after` is its remaining lease.
    Busy {
        /// The lock's name as the caller gave it (escaped).
        key: String,
        /// The holder's remaining lease when we asked. A key without expiry (written by
        /// something other than this crate) has none: the config's longest backoff step.
        retry_after: Duration,
    },
    /// `lock`: the wait budget ran out while another owner kept the lock.
    Timeout {
        /// The lock's name (escaped).
        key: String,
        /// How long we waited.
        waited: Duration,
    },
    /// Release or extend found another owner holding the lock: ours expired and was
    /// taken over. The work done under it may have overlapped with the new holder's.
    NotOwner {
        /// The lock's name (escaped).
        key: String,
    },
    /// Release or extend found no lock at all: our lease ran out before we got there.
    Expired {
        /// The lock's name (escaped).
        key: String,
    },
    /// A key part or a namespace the caller supplied is not acceptable.
    InvalidKey(String),
    /// A lease, wait or period outside what this crate accepts.
    InvalidConfig(String),
    /// The Redis server is older than the scripts need (checked once, when a client
    /// opens). Upgrade the server; retrying will not help.
    UnsupportedRedis {
        /// The version the server reported (and on a Cluster, which node).
        found: String,
        /// The oldest version that works: `7.0`.
        needed: &'static str,
    },
    /// The Redis server evicts keys under memory pressure (checked once, when a client
    /// opens): it could drop a lock before its lease ends or a fencing counter, and let
    /// two holders in. Set `maxmemory-policy noeviction`; retrying will not help.
    EvictingRedis {
        /// The server's `maxmemory-policy`.
        policy: String,
        /// Its `maxmemory`, in bytes (above zero: eviction can happen).
        maxmemory: u64,
        /// On a Cluster, the master's address.
        node: Option<String>,
    },
    /// The process-wide or per-call operation timed out talking to Redis.
    RedisTimeout {
        /// What we were doing.
        op: &'static str,
        /// The time limit that passed.
        after: Duration,
    },
    /// Redis could not be reached, or answered with an error.
    Redis(redis::RedisError),
    /// Redis answered with something our scripts never return (a different script
    /// under the same SHA, a proxy in the way, ...).
    UnexpectedReply(String),
    /// No order id can be issued right now: the system clock stepped back further than
    /// the generator may wait, lies outside the id's 31-bit seconds range, or the day's
    /// 32-bit sequence is used up. The text says which, and what to do.
    IdsUnavailable(String),
    /// A store other than Redis (PostgreSQL, MySQL, ZooKeeper) could not be reached or
    /// answered with an error.
    Store {
        /// Which store: `postgres`, `mysql`, `zookeeper`.
        store: &'static str,
        /// What it said.
        message: String,
    },
    /// [`Redlock`](crate::Redlock): fewer nodes than the quorum agreed (they were down,
    /// slow, or answered with errors), so the operation did not take effect.
    NoQuorum {
        /// The lock's name (escaped).
        key: String,
        /// What was attempted: `acquire`, `extend`, `reenter` or `release`.
        op: &'static str,
        /// Nodes that agreed.
        granted: usize,
        /// Nodes that must agree (N/2 + 1).
        needed: usize,
        /// Nodes in the Redlock.
        nodes: usize,
        /// What one of the failing nodes said, if any failed with an error.
        cause: Option<String>,
    },
    /// The store granted the lock, but its answer came so late that nothing of the
    /// lease was left (a request that sat in a paused or overloaded server, or a lease
    /// shorter than a round trip; for a [`Redlock`](crate::Redlock), a quorum granted
    /// but validity = lease - elapsed - drift was used up), so the grant was given
    /// back. Nobody else holds the lock for it.
    ValidityExhausted {
        /// The lock's name (escaped).
        key: String,
        /// Time from before the first request to the last answer.
        elapsed: Duration,
        /// The lease asked for.
        lease: Duration,
    },
    /// This grant has no fencing token to give (a [`Redlock`](crate::Redlock) takes
    /// tokens from its first node, which did not grant this lock). Fencing with it is
    /// impossible: take the lock again, or write without a token.
    NoFencingToken {
        /// The lock's name (escaped).
        key: String,
        /// Why there is none.
        reason: &'static str,
    },
    /// This store cannot take this kind of hold (a read or write hold where the
    /// store has no shared holds): nothing was asked of the store. Use another store
    /// for this lock, or a plain (exclusive) lock.
    Unsupported {
        /// The lock's name (escaped).
        key: String,
        /// What the store lacks.
        reason: &'static str,
    },
    /// The scope holds a read hold of this lock and asked for its write hold: waiting
    /// for it would wait for itself. Release the read hold first, then take the write
    /// hold (and check again what was read: another writer may have come between).
    Upgrade {
        /// The lock's name (escaped).
        key: String,
    },
}

impl LockError {
    /// Another owner holds the lock (`try_lock` without waiting).
    pub fn is_busy(&self) -> bool {
        matches!(self, Self::Busy { .. })
    }

    /// The wait budget ran out, or a Redis call did not answer in time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. } | Self::RedisTimeout { .. })
            || matches!(self, Self::Redis(e) if e.is_timeout())
    }

    /// The lock is held by someone else now (we lost it).
    pub fn is_not_owner(&self) -> bool {
        matches!(self, Self::NotOwner { .. })
    }

    /// The lock's lease ran out before release or extend.
    pub fn is_expired(&self) -> bool {
        matches!(self, Self::Expired { .. })
    }

    /// The lock was lost: expired, or taken over by another owner.
    pub fn is_lost(&self) -> bool {
        self.is_expired() || self.is_not_owner()
    }

    /// Redis was unreachable, timed out, or answered with an error or an unexpected
    /// reply; for a [`Redlock`](crate::Redlock), too few nodes answered
    /// ([`is_no_quorum`](Self::is_no_quorum)).
    pub fn is_redis(&self) -> bool {
        matches!(
            self,
            Self::Redis(_)
                | Self::RedisTimeout { .. }
                | Self::UnexpectedReply(_)
                | Self::NoQuorum { .. }
                | Self::ValidityExhausted { .. }
        )
    }

    /// Redis gave no answer (unreachable, the connection dropped, timed out), or too few
    /// Redlock nodes did: the same call may go through if sent again, unlike an error
    /// reply (a key of another type, say).
    pub(crate) fn is_no_answer(&self) -> bool {
        match self {
            Self::RedisTimeout { .. } | Self::NoQuorum { .. } => true,
            Self::Redis(e) => e.is_io_error(),
            _ => false,
        }
    }

    /// A [`Redlock`](crate::Redlock) operation failed for want of a quorum, or a grant
    /// (of a Redlock or any store) came too late to leave any validity.
    pub fn is_no_quorum(&self) -> bool {
        matches!(self, Self::NoQuorum { .. } | Self::ValidityExhausted { .. })
    }

    /// The lock store (Redis or another) could not be reached, timed out, or failed:
    /// [`is_redis`](Self::is_redis) or a [`Store`](Self::Store) error. Retry later.
    pub fn is_unavailable(&self) -> bool {
        self.is_redis() || matches!(self, Self::Store { .. })
    }

    /// An order id could not be issued: clock stepped back too far, or sequence used up.
    pub fn is_ids_unavailable(&self) -> bool {
        matches!(self, Self::IdsUnavailable(_))
    }

    /// The caller's input (key, lease, config) was rejected before Redis was asked.
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Self::InvalidKey(_) | Self::InvalidConfig(_))
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Busy { key, retry_after } => write!(
                f,
                "lock `{key}` is held by another owner (its lease ends in {retry_after:?}); \
                 retry later or wait with `lock` instead of `try_lock`"
            ),
            Self::Timeout { key, waited } => write!(
                f,
                "gave up waiting for lock `{key}` after {waited:?}; raise the wait budget \
                 or find out why the holder keeps it this long"
            ),
            Self::NotOwner { key } => write!(
                f,
                "lock `{key}` is held by another owner: our lease ran out and it was taken over"
            ),
            Self::Expired { key } => write!(
                f,
                "lock `{key}` expired before it was released or extended; use a longer \
                 lease or the watchdog"
            ),
            Self::InvalidKey(why) => write!(f, "invalid lock key: {why}"),
            Self::InvalidConfig(why) => write!(f, "invalid lock configuration: {why}"),
            Self::UnsupportedRedis { found, needed } => write!(
                f,
                "the Redis server is version {found}, but lock-core needs Redis {needed} or \
                 newer (its scripts use the Redis 7 `#!lua` shebang); upgrade the server"
            ),
            Self::EvictingRedis {
                policy,
                maxmemory,
                node,
            } => write!(
                f,
                "the Redis server{} evicts keys when full (maxmemory-policy {policy}, maxmemory \
                 {maxmemory} bytes): it could drop a lock before its lease ends or a fencing \
                 counter, and let two holders in; set `maxmemory-policy noeviction` (CONFIG \
                 SET and redis.conf)",
                node.as_deref()
                    .map(|n| format!(" at {n}"))
                    .unwrap_or_default()
            ),
            Self::RedisTimeout { op, after } => write!(
                f,
                "redis did not answer `{op}` within {after:?}; is the server up and reachable?"
            ),
            Self::Redis(e) => write!(f, "redis error: {e}"),
            Self::UnexpectedReply(what) => write!(f, "unexpected reply from redis: {what}"),
            Self::IdsUnavailable(why) => write!(f, "order ids unavailable: {why}"),
            Self::Store { store, message } => write!(
                f,
                "{store} lock store error: {message}; is the server up and reachable?"
            ),
            Self::NoQuorum {
                key,
                op,
                granted,
                needed,
                nodes,
                cause,
            } => {
                write!(
                    f,
                    "redlock {op} of `{key}` failed: {granted} of {nodes} nodes agreed, \
                     {needed} needed; check that a majority of the Redis masters is up \
                     and answers within the per-node timeout"
                )?;
                match cause {
                    Some(cause) => write!(f, " (a failing node said: {cause})"),
                    None => Ok(()),
                }
            }
            Self::NoFencingToken { key, reason } => {
                write!(f, "no fencing token for this grant of `{key}`: {reason}")
            }
            Self::Unsupported { key, reason } => {
                write!(f, "cannot take `{key}` this way: {reason}")
            }
            Self::Upgrade { key } => write!(
                f,
                "this scope holds a read hold of `{key}` and asked for its write hold, \
                 which would wait for itself: release the read hold first"
            ),
            Self::ValidityExhausted {
                key,
                elapsed,
                lease,
            } => write!(
                f,
                "acquiring `{key}` took {elapsed:?}, which used up its {lease:?} lease, so \
                 the grant was given back (nobody else holds it); use a longer lease (or, for \
                 a Redlock, a shorter per-node timeout)"
            ),
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Redis(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for LockError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}

/// A redis-rs error met reading a URL or building a client from it: a URL or setting it
/// refuses is the caller's input ([`LockError::InvalidConfig`]: no retry mends it),
/// anything else stays a Redis error.
pub(crate) fn from_setup(e: redis::RedisError) -> LockError {
    if e.kind() == redis::ErrorKind::InvalidClientConfig {
        LockError::InvalidConfig(format!("{e}: check the Redis URL and its settings"))
    } else {
        LockError::Redis(e)
    }
}

/// For fns returning `std::io::Result`: busy and timeouts keep their meaning in the
/// [`std::io::ErrorKind`], and the `LockError` stays reachable through `get_ref`.
impl From<LockError> for std::io::Error {
    fn from(e: LockError) -> Self {
        use std::io::ErrorKind;
        let kind = match &e {
            LockError::Busy { .. } => ErrorKind::WouldBlock,
            e if e.is_timeout() => ErrorKind::TimedOut,
            e if e.is_invalid_input() => ErrorKind::InvalidInput,
            e if e.is_lost() => ErrorKind::Other,
            _ => ErrorKind::ConnectionAborted,
        };
        std::io::Error::new(kind, e)
    }
}
