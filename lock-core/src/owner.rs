//! Who holds a lock: a random client id plus a scope counter, and the fencing token
//! that names one grant.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::LockError;

/// 128 random bits from the OS CSPRNG naming one [`LockClient`](crate::LockClient).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientId([u8; 16]);

impl ClientId {
    pub(crate) fn random() -> Result<Self, LockError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes)
            .map_err(|e| LockError::InvalidConfig(format!("the OS random source failed: {e}")))?;
        Ok(Self(bytes))
    }

    /// The low 64 bits of the id.
    pub(crate) fn low64(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[8..]);
        u64::from_le_bytes(b)
    }

    /// Fencing token `token` of this client's grant number `seq`. Its holder id is
    /// distinct for every grant of this client (an odd multiplier is a bijection) and
    /// unrelated between clients (their ids are random).
    pub(crate) fn grant_token(&self, seq: u64, token: u64) -> FencingToken {
        let holder = self.low64() ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        FencingToken::new(token, holder)
    }

    /// The id as 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        use fmt::Write;
        self.0.iter().fold(String::with_capacity(32), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

impl fmt::Debug for ClientId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClientId({})", self.to_hex())
    }
}

static NEXT_SCOPE: AtomicU64 = AtomicU64::new(1);

tokio::task_local! {
    static CURRENT: LockScope;
}

/// One logical operation that may take the same lock more than once.
///
/// Behavior:
/// - A lock's owner is the client's random id plus the scope's number. Two acquisitions
///   of the same lock under the same scope *re-enter*: the hold count goes up instead of
///   the second one waiting for the first (which would deadlock).
/// - Different scopes, tasks or processes exclude each other.
/// - An acquisition outside any scope gets a fresh owner: it is not reentrant.
/// - A scope is entered with [`LockScope::run`] (a tokio task-local), or passed explicitly
///   with [`LockOptions::scope`](crate::LockOptions::scope).
///
/// ```no_run
/// # async fn demo(client: lock_core::LockClient) -> Result<(), lock_core::LockError> {
/// use lock_core::LockScope;
///
/// LockScope::new().run(async {
///     let outer = client.lock("account:7").await?;
///     let inner = client.lock("account:7").await?; // re-enters, does not wait
///     assert_eq!(inner.fence().await?, outer.fence().await?); // one grant, one token
///     inner.release().await?;
///     outer.release().await?;
///     Ok(())
/// }).await
/// # }
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockScope {
    id: u64,
}

impl fmt::Debug for LockScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockScope({})", self.id)
    }
}

impl Default for LockScope {
    fn default() -> Self {
        Self::new()
    }
}

impl LockScope {
    /// A scope no other acquisition shares yet.
    pub fn new() -> Self {
        Self {
            id: NEXT_SCOPE.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The scope of the running task, if it is inside [`LockScope::run`].
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// The current scope, or a new one when the task is in none.
    pub fn current_or_new() -> Self {
        Self::current().unwrap_or_default()
    }

    /// Runs `fut` with this scope as the task's current scope.
    // Not an `async fn`: its state would hold `fut` once more, and every await moves
    // the whole (often large) future again.
    pub fn run<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, fut)
    }

    /// The scope with number `id` (as returned by [`id`](Self::id)).
    pub(crate) fn from_id(id: u64) -> Self {
        Self { id }
    }

    /// The scope's number (unique in this process).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Appends this scope's owner id, `<client>:<scope number>`, to `out`.
    pub(crate) fn write_owner(&self, client: &str, out: &mut String) {
        out.push_str(client);
        out.push(':');
        push_decimal(out, self.id);
    }
}

/// Appends `n` in decimal to `out`, without `fmt`'s machinery.
pub(crate) fn push_decimal(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Appends `n` in lowercase hexadecimal to `out`, without `fmt`'s machinery.
pub(crate) fn push_hex(out: &mut String, mut n: u64) {
    let mut buf = [0u8; 16];
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b"0123456789abcdef"[(n & 15) as usize];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    // Hex digits are ASCII, so always UTF-8.
    out.push_str(std::str::from_utf8(&buf[at..]).unwrap_or_default());
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_ids_are_random_and_hex() {
        let a = ClientId::random().unwrap();
        let b = ClientId::random().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.to_hex().len(), 32);
        assert!(a.to_hex().chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[tokio::test]
    async fn scopes_nest_through_the_task_local() {
        assert!(LockScope::current().is_none());
        let s = LockScope::new();
        let seen = s.clone().run(async { LockScope::current() }).await;
        assert_eq!(seen, Some(s.clone()));
        assert_ne!(LockScope::new(), s);
        let mut owner = String::new();
        s.write_owner("c", &mut owner);
        assert_eq!(owner, format!("c:{}", s.id()));
    }

    #[test]
    fn digits_match_the_formatter() {
        let mut rng = fastrand::Rng::with_seed(7);
        let edges = [0, 1, 9, 10, 15, 16, 255, u64::MAX - 1, u64::MAX];
        for n in edges
            .into_iter()
            .chain((0..2000).map(|_| rng.u64(..) >> rng.u32(0..64)))
        {
            let (mut d, mut x) = (String::new(), String::new());
            push_decimal(&mut d, n);
            push_hex(&mut x, n);
            assert_eq!(d, n.to_string());
            assert_eq!(x, format!("{n:x}"));
        }
    }
}
