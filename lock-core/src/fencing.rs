//! Fencing tokens and the fenced write.

use redis::ToRedisArgs;

use crate::key::{self, LockName};
use crate::scripts::FENCED_WRITE;
use crate::{LockClient, LockError};

/// A number that grows with every fresh grant of one lock.
///
/// A lock can be lost without its holder knowing (a long pause, a network partition):
/// the resource it protects should remember the highest token it has seen and refuse
/// writes carrying a lower one. [`LockClient::fenced_write`] does exactly that for a
/// value stored in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    pub(crate) fn new(v: u64) -> Self {
        Self(v)
    }

    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Outcome of [`LockClient::fenced_write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencedWrite {
    /// Stored; this token is now the highest the resource has seen.
    Written,
    /// Refused: a holder with the newer token `highest` has written already.
    Refused {
        /// The newest token the resource has accepted.
        highest: FencingToken,
    },
}

impl LockClient {
    /// Stores `value` for `resource` unless a write with a newer fencing token came first
    /// (the script `lua/fenced_write.lua`). Equal tokens are accepted (the same holder
    /// writing again).
    pub async fn fenced_write<N: LockName, V: ToRedisArgs>(
        &self,
        resource: N,
        token: FencingToken,
        value: V,
    ) -> Result<FencedWrite, LockError> {
        let c = &self.inner.config;
        let (value_key, token_key) = key::fenced_keys(&c.namespace, &c.delimiter, &resource)?;
        let mut inv = FENCED_WRITE.prepare_invoke();
        inv.key(value_key).key(token_key).arg(token.0).arg(value);
        let reply: Vec<u64> = self.inner.conn.invoke("fenced_write", &inv).await?;
        match reply[..] {
            [1, _] => Ok(FencedWrite::Written),
            [0, highest] => Ok(FencedWrite::Refused {
                highest: FencingToken(highest),
            }),
            _ => Err(LockError::UnexpectedReply(format!(
                "fenced_write.lua returned {reply:?}"
            ))),
        }
    }

    /// The value last stored with [`fenced_write`](Self::fenced_write) for `resource`.
    pub async fn fenced_read<N: LockName>(
        &self,
        resource: N,
    ) -> Result<Option<Vec<u8>>, LockError> {
        let c = &self.inner.config;
        let (value_key, _) = key::fenced_keys(&c.namespace, &c.delimiter, &resource)?;
        self.inner
            .conn
            .query("fenced_read", redis::cmd("GET").arg(value_key))
            .await
    }
}
