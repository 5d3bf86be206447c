//! The fenced write: a value stored in Redis that refuses stale fencing tokens
//! ([`FencingToken`]).

use redis::ToRedisArgs;

use crate::client::Client;
use crate::client::store::Args;
use crate::client::store::key::{self, LockName};
use crate::client::store::scripts::{FENCED_WRITE, FencedWriteReply};
use crate::error::LockError;
use crate::owner::FencingToken;

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
                .arg(token.get())
                .arg(token.holder())
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
        .query("fenced_read", Args::cmd("GET").arg(value_key))
        .await
}
