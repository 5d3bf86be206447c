//! Fencing tokens and the fenced write.

use redis::ToRedisArgs;

use crate::client::Client;
use crate::client::store::key::{self, LockName};
use crate::client::store::scripts::{FENCED_WRITE, FencedWriteReply};
use crate::error::LockError;

/// A number that grows with every fresh grant of one lock, and the grant it belongs to.
///
/// A lock can be lost without its holder knowing (a long pause, a network partition):
/// the resource it protects should remember the newest token it has seen and refuse
/// writes carrying an older one. [`LockClient::fenced_write`](crate::LockClient::fenced_write) does exactly that for a
/// value stored in Redis.
///
/// How the numbers are made: one counter per hash slot of the namespace (see
/// [`key`](crate::key)), incremented by every fresh grant in that slot, in the same
/// script that grants. A lock name always lives in the same slot, so its tokens only
/// grow, and the counters stay bounded (at most 16384 per namespace) however many names
/// are ever locked. The counter is replicated asynchronously like any key: after a
/// failover, the promoted replica may hand out a number again. The token therefore also
/// carries its grant's holder id, and a fenced write with a token equal to the newest
/// seen is accepted only from that same holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken {
    token: u64,
    holder: u64,
}

impl FencingToken {
    pub(crate) fn new(token: u64, holder: u64) -> Self {
        Self { token, holder }
    }

    /// The token as a number.
    pub fn get(self) -> u64 {
        self.token
    }

    /// The id of the grant this token was issued to (unique per grant).
    pub fn holder(self) -> u64 {
        self.holder
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.token.fmt(f)
    }
}

/// Outcome of [`LockClient::fenced_write`](crate::LockClient::fenced_write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencedWrite {
    /// Stored; this token is now the highest the resource has seen.
    Written,
    /// Refused: a newer token `highest`, or the same token from another holder, has
    /// written already.
    Refused {
        /// The newest token the resource has accepted.
        highest: FencingToken,
    },
}

/// [`LockClient::fenced_write`](crate::LockClient::fenced_write) on `client`.
pub(crate) async fn fenced_write<N: LockName, V: ToRedisArgs>(
    client: &Client,
    resource: N,
    token: FencingToken,
    value: V,
) -> Result<FencedWrite, LockError> {
    let c = client.config();
    let (value_key, token_key) = key::fenced_keys(&c.namespace, &c.delimiter, &resource)?;
    let mut value = value.to_redis_args();
    let value = match value.len() {
        1 => value.pop().unwrap_or_default(),
        n => {
            return Err(LockError::InvalidConfig(format!(
                "a fenced write stores exactly one value, but this one is {n} Redis \
                 arguments; join or encode it into one string or byte buffer"
            )));
        }
    };
    let conn = client.conn();
    let reply = conn
        .eval(&FENCED_WRITE, conn.timeout(), |c| {
            c.arg(2)
                .arg(&value_key)
                .arg(&token_key)
                .arg(token.token)
                .arg(token.holder)
                .arg(&value);
        })
        .await?;
    Ok(match FencedWriteReply::decode(reply)? {
        FencedWriteReply::Written => FencedWrite::Written,
        FencedWriteReply::Refused { newest, holder } => FencedWrite::Refused {
            highest: FencingToken::new(newest, holder),
        },
    })
}

/// [`LockClient::fenced_read`](crate::LockClient::fenced_read) on `client`.
pub(crate) async fn fenced_read<N: LockName>(
    client: &Client,
    resource: N,
) -> Result<Option<Vec<u8>>, LockError> {
    let c = client.config();
    let (value_key, _) = key::fenced_keys(&c.namespace, &c.delimiter, &resource)?;
    client
        .conn()
        .query("fenced_read", redis::cmd("GET").arg(value_key))
        .await
}
