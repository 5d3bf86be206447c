//! Server-issued one-time tokens: issue before the form, consume on submit.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::client::config::check_lease;
use crate::client::store::Args;
use crate::client::store::key::{LockName, NameWriter};
use crate::error::LockError;

/// Length of an issued token: 32 lowercase hex digits (128 bits from the OS CSPRNG).
const TOKEN_LEN: usize = 32;

/// One-time tokens: the server hands out a token (say with the order form), and the
/// submission that presents it first is the only one accepted. Get them with
/// [`LockClient::one_time_tokens`](crate::LockClient::one_time_tokens).
///
/// Behavior:
/// - [`issue`](Self::issue) stores a fresh random token (128 bits, OS CSPRNG) for a
///   scope, with a time to live; [`consume`](Self::consume) deletes it and says whether
///   it was there. Deleting is atomic (one `DEL`), so of any number of concurrent
///   consumers exactly one gets `true`.
/// - A token is only valid in the scope it was issued for (e.g. `("checkout", user)`).
/// - Anything that is not a token this type could have issued is refused with
///   `Ok(false)` without asking Redis.
/// - Keys: `<namespace>:{<name><delim><scope parts>...<delim><token>}:token`, built by
///   [`crate::key`].
///
/// ```no_run
/// use std::time::Duration;
/// use lock_core::LockClient;
///
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// let client = LockClient::open("redis://127.0.0.1:6379/").await?;
/// let tokens = client.one_time_tokens("forms");
/// let token = tokens.issue(("checkout", 42_u64), Duration::from_secs(600)).await?;
/// assert!(tokens.consume(("checkout", 42_u64), &token).await?); // the first submission
/// assert!(!tokens.consume(("checkout", 42_u64), &token).await?); // a resubmission
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct OneTimeTokens {
    client: Client,
    name: Arc<str>,
}

impl std::fmt::Debug for OneTimeTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneTimeTokens")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The scope's parts, then the token.
struct Scoped<'a, N: ?Sized> {
    scope: &'a N,
    token: &'a str,
}

impl<N: LockName + ?Sized> LockName for Scoped<'_, N> {
    fn write_parts(&self, w: &mut NameWriter) {
        self.scope.write_parts(w);
        w.part(self.token);
    }
}

impl OneTimeTokens {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            client,
            name: name.into(),
        }
    }

    /// The name the tokens' keys start with.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Issues a fresh token for `scope`, valid for `ttl` (within
    /// [`MIN_LEASE`](crate::MIN_LEASE)`..=`[`MAX_LEASE`](crate::MAX_LEASE)) or until consumed.
    pub async fn issue<N: LockName>(&self, scope: N, ttl: Duration) -> Result<String, LockError> {
        check_lease("token time to live", ttl)?;
        let mut bytes = [0u8; TOKEN_LEN / 2];
        getrandom::fill(&mut bytes)
            .map_err(|e| LockError::InvalidConfig(format!("the OS random source failed: {e}")))?;
        let token = bytes
            .iter()
            .fold(String::with_capacity(TOKEN_LEN), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            });
        let key = self.key(&scope, &token)?;
        let set: Option<String> = self
            .client
            .conn()
            .query(
                "token issue",
                Args::cmd("SET")
                    .arg(key)
                    .arg(1)
                    .arg("PX")
                    .arg(ttl.as_millis() as u64)
                    .arg("NX"),
            )
            .await?;
        match set {
            Some(_) => Ok(token),
            None => Err(LockError::UnexpectedReply(
                "a freshly drawn 128-bit token already existed".into(),
            )),
        }
    }

    /// Consumes `token` in `scope`: `true` for the one caller that finds it there;
    /// `false` when it was never issued (for this scope), expired, or was consumed
    /// already.
    pub async fn consume<N: LockName>(&self, scope: N, token: &str) -> Result<bool, LockError> {
        let well_formed = token.len() == TOKEN_LEN
            && token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            return Ok(false);
        }
        let key = self.key(&scope, token)?;
        let deleted: i64 = self
            .client
            .conn()
            .query("token consume", Args::cmd("DEL").arg(key))
            .await?;
        Ok(deleted == 1)
    }

    fn key<N: LockName + ?Sized>(&self, scope: &N, token: &str) -> Result<String, LockError> {
        self.client
            .prefixed_key(&self.name, &Scoped { scope, token }, "token")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn token_keys_cannot_be_forged_from_the_scope() {
        // The token is its own part: a scope that ends like a token gives another key.
        use super::*;
        let keys = |scope: &str, token: &str| {
            crate::client::store::key::lock_keys("lock", ":", &Scoped { scope, token })
                .unwrap()
                .key
        };
        assert_ne!(keys("a:b", "c"), keys("a", "b:c"));
        assert_eq!(keys("a", "b"), "lock:{a:b}");
    }
}
