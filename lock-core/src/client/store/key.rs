//! Every Redis key and channel of this crate's own layout is built here, and only here
//! (Redisson's layout, a foreign one, is built in `backends/redisson/layout.rs` from
//! the escaped name made here).
//!
//! A lock name is one or more *parts* (user ids, order numbers, ...). Each part is
//! percent-escaped so it can never contain the delimiter, `{`, `}` or `%`, then the parts
//! are joined with the delimiter and wrapped in a hash tag:
//!
//! ```text
//! <namespace>:{<part><delim><part>...}            the lock: a string holding the grant's value
//! <namespace>:{<part><delim><part>...}:waiters    waiter marker: someone waits (expires)
//! <namespace>:{<part><delim><part>...}:released   its release channel
//! <namespace>:{<part><delim><part>...}:fenced-value / :fenced-token
//!                                                  a fenced resource of that name
//! <namespace>:fence:{<slot tag>}                  the fencing counter of one hash slot
//! ```
//!
//! Because a part can hold neither braces nor the delimiter, user input cannot end the
//! hash tag early, add a suffix, or shift a part boundary: two different part lists
//! always give two different keys, and all keys of one lock share one cluster slot.
//!
//! Fencing counters are per hash slot, not per lock: `<slot tag>` is the shortest
//! decimal number whose CRC16 lands in the lock's slot, so the counter sits in the
//! lock's slot (one script can touch both on a Cluster), and at most 16384 counters
//! exist per namespace however many lock names are ever used. A lock name always maps
//! to the same slot, so its tokens still only grow.

use std::fmt::Write as _;

use crate::error::LockError;

/// Longest accepted lock name, in bytes, after escaping and joining its parts.
pub const MAX_NAME_LEN: usize = 1024;
/// Longest accepted namespace, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;

/// A value that can be one part of a lock name.
///
/// Implemented for strings, integers, `bool`, `char` and references to them. Implement it
/// for your own id types by writing their canonical text form:
///
/// ```
/// use lock_core::KeyPart;
///
/// struct UserId(u64);
///
/// impl KeyPart for UserId {
///     fn write_part(&self, out: &mut String) {
///         use std::fmt::Write;
///         let _ = write!(out, "{}", self.0);
///     }
/// }
/// ```
///
/// Write the raw value: escaping is done for you.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of a lock key: it does not implement `lock_core::KeyPart`",
    label = "used as a lock key part here",
    note = "implement it by writing the value's canonical text: `impl lock_core::KeyPart for {Self} {{ fn write_part(&self, out: &mut String) {{ /* push the text */ }} }}`",
    note = "or use a field that already is a key part: integers, strings, `bool`, `char`, IP addresses"
)]
pub trait KeyPart {
    /// Appends this part's text form to `out`.
    fn write_part(&self, out: &mut String);
}

impl KeyPart for str {
    fn write_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for String {
    fn write_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for std::borrow::Cow<'_, str> {
    fn write_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl KeyPart for std::sync::Arc<str> {
    fn write_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn write_part(&self, out: &mut String) {
        (**self).write_part(out);
    }
}

impl<T: KeyPart + ?Sized> KeyPart for Box<T> {
    fn write_part(&self, out: &mut String) {
        (**self).write_part(out);
    }
}

macro_rules! display_key_part {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_part(&self, out: &mut String) {
                let _ = write!(out, "{self}");
            }
        }
    )*};
}
/// Unsigned integers without `fmt`'s machinery (a lock per user or order id is the
/// common name). `as u64` is lossless: no target Rust supports has a wider `usize`.
macro_rules! unsigned_key_part {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn write_part(&self, out: &mut String) {
                crate::owner::push_decimal(out, *self as u64);
            }
        }
    )*};
}
unsigned_key_part!(u8, u16, u32, u64, usize);

display_key_part!(
    u128,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    bool,
    char,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroUsize,
    std::num::NonZeroI64,
    std::net::IpAddr,
    std::net::Ipv4Addr,
    std::net::Ipv6Addr,
    std::net::SocketAddr
);

impl KeyPart for std::rc::Rc<str> {
    fn write_part(&self, out: &mut String) {
        out.push_str(self);
    }
}

/// A whole lock name: one [`KeyPart`], a tuple of them, or a slice/array/`Vec` of them.
///
/// ```
/// # fn names<N: lock_core::LockName>(_: N) {}
/// names("inventory");            // one part
/// names(("order", 42_u64));      // two parts: "order" and "42"
/// names(["seckill", "v1", "7"]); // three parts
/// ```
pub trait LockName {
    /// Hands each part, in order, to `parts`.
    fn write_parts(&self, parts: &mut NameWriter);
}

impl<T: KeyPart + ?Sized> LockName for T {
    fn write_parts(&self, parts: &mut NameWriter) {
        parts.part(self);
    }
}

impl<T: KeyPart> LockName for [T] {
    fn write_parts(&self, parts: &mut NameWriter) {
        self.iter().for_each(|p| parts.part(p));
    }
}

impl<T: KeyPart> LockName for &[T] {
    fn write_parts(&self, parts: &mut NameWriter) {
        self.iter().for_each(|p| parts.part(p));
    }
}

impl<T: KeyPart, const N: usize> LockName for [T; N] {
    fn write_parts(&self, parts: &mut NameWriter) {
        self.iter().for_each(|p| parts.part(p));
    }
}

impl<T: KeyPart> LockName for Vec<T> {
    fn write_parts(&self, parts: &mut NameWriter) {
        self.iter().for_each(|p| parts.part(p));
    }
}

macro_rules! tuple_lock_name {
    ($($name:ident),+) => {
        impl<$($name: KeyPart),+> LockName for ($($name,)+) {
            #[allow(non_snake_case)]
            fn write_parts(&self, parts: &mut NameWriter) {
                let ($($name,)+) = self;
                $(parts.part($name);)+
            }
        }
    };
}
tuple_lock_name!(A);
tuple_lock_name!(A, B);
tuple_lock_name!(A, B, C);
tuple_lock_name!(A, B, C, D);
tuple_lock_name!(A, B, C, D, E);
tuple_lock_name!(A, B, C, D, E, F);

/// Collects the escaped parts of a [`LockName`]; handed to [`LockName::write_parts`].
///
/// Parts are written straight after what precedes the name (the namespace, when
/// building a lock's key), so a name costs one buffer, not one per part.
#[derive(Debug)]
pub struct NameWriter<'a> {
    delimiter: &'a str,
    out: String,
    parts: usize,
    empty_part: Option<usize>,
    /// A part's `write_part` removed text written before it.
    mangled: bool,
    /// Fewest parts the name must have: one, or one more than a feature's name that
    /// comes first (see [`own_parts_follow`](Self::own_parts_follow)).
    min_parts: usize,
}

impl NameWriter<'_> {
    /// The parts written so far are a feature's name (a rate limiter's, an idempotency
    /// store's): the caller's key must still add one of its own, or every caller with
    /// an empty key would share one.
    pub(crate) fn own_parts_follow(&mut self) {
        self.min_parts = self.parts + 1;
    }

    /// Appends one part (escaped) to the name.
    pub fn part<P: KeyPart + ?Sized>(&mut self, part: &P) {
        if self.parts > 0 {
            self.out.push_str(self.delimiter);
        }
        self.parts += 1;
        let at = self.out.len();
        part.write_part(&mut self.out);
        if self.out.len() < at || !self.out.is_char_boundary(at) {
            // Only this part's own text may change; what came before is not its own.
            self.mangled = true;
            self.out.clear();
            return;
        }
        if self.out.len() == at && self.empty_part.is_none() {
            self.empty_part = Some(self.parts - 1);
        }
        if !needs_escaping(self.delimiter, &self.out.as_bytes()[at..]) {
            return;
        }
        let raw = self.out.split_off(at);
        for c in raw.chars() {
            if reserved(c) || self.delimiter.contains(c) {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    let _ = write!(self.out, "%{b:02X}");
                }
            } else {
                self.out.push(c);
            }
        }
    }
}

/// Characters escaped in a part whatever the delimiter (the hash tag's braces and the
/// escape itself), which a namespace or delimiter may not hold either.
fn reserved(c: char) -> bool {
    u8::try_from(c).is_ok_and(|b| RESERVED.contains(&b))
}

/// The characters [`reserved`] names, as bytes.
const RESERVED: [u8; 3] = *b"%{}";

/// 1 at each byte of [`RESERVED`], 0 elsewhere.
static RESERVED_BYTES: [u8; 256] = {
    let mut table = [0; 256];
    let mut i = 0;
    while i < RESERVED.len() {
        table[RESERVED[i] as usize] = 1;
        i += 1;
    }
    table
};

/// Whether `part` has a character to escape; a byte test when the delimiter is ASCII
/// (a multi-byte character's bytes are never ASCII).
fn needs_escaping(delimiter: &str, part: &[u8]) -> bool {
    let reserved = |b: u8| reserved(char::from(b));
    // Byte `b` is the one-character delimiter `d` or reserved: compares without a
    // branch (`contains` on bytes would call `memchr`).
    let hit = |b: u8, d: u8| RESERVED.iter().fold(b == d, |found, &r| found | (b == r));
    match delimiter.as_bytes() {
        // The usual one-character delimiter, on every part of every name. A short part
        // (a word, an id): a table look-up per byte, without a branch.
        &[d] if d.is_ascii() && part.len() < 16 => {
            part.iter().fold(0, |found, &b| {
                found | RESERVED_BYTES[usize::from(b)] | u8::from(b == d)
            }) != 0
        }
        // A longer one, each chunk tested without a branch per byte, which the compiler
        // turns into vector compares (a hex digest or a path costs a few steps, not one
        // per byte).
        &[d] if d.is_ascii() => part
            .chunks(32)
            .any(|chunk| chunk.iter().fold(false, |found, &b| found | hit(b, d))),
        d if delimiter.is_ascii() => part.iter().any(|&b| reserved(b) || d.contains(&b)),
        _ => true,
    }
}

/// The Redis keys and channel of one lock, all in one hash slot.
///
/// Only the lock key is built up front, with the name inside it: an uncontended
/// acquisition needs nothing else. The others derive from the key on demand.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LockKeys {
    /// The lock itself: a string holding the current grant's value, with the lease as
    /// its expiry (for a read or write hold, the read-write lock's hash of holders).
    pub key: String,
    /// Where the escaped, joined name sits in `key`: kept, not searched for, because
    /// every release reads the name.
    name_at: (u32, u32),
    /// The kind of hold these keys are for.
    pub(crate) mode: LockMode,
    /// `key` hashed once, with this process's seed: what the client's tables of holds
    /// look it up by, so a cycle hashes the string once however many lookups it makes.
    pub(crate) hash: u64,
}

/// The hash of a lock key in this process's tables (see [`LockKeys::hash`]): seeded at
/// random once per process, so names users choose cannot be made to collide.
pub(crate) fn local_hash(key: &str) -> u64 {
    use std::hash::BuildHasher;
    static SEED: std::sync::LazyLock<foldhash::fast::RandomState> =
        std::sync::LazyLock::new(foldhash::fast::RandomState::default);
    SEED.hash_one(key)
}

impl std::fmt::Debug for LockKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockKeys")
            .field("name", &self.name())
            .field("key", &self.key)
            .field("mode", &self.mode)
            .finish()
    }
}

/// The kind of hold an acquisition takes ([`LockOptions::read`](crate::LockOptions::read),
/// [`write`](crate::LockOptions::write)).
///
/// A name taken with read and write holds is a read-write lock: many readers or one
/// writer. It is a lock of its own beside the plain (exclusive) lock of the same name:
/// use a name either way, not both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum LockMode {
    /// A plain lock: one holder.
    #[default]
    Exclusive,
    /// A read hold of a read-write lock: shared with other readers, never with a writer.
    Read,
    /// The write hold of a read-write lock: alone.
    Write,
}

impl LockMode {
    /// A read or write hold (of a read-write lock).
    pub fn is_read_write(self) -> bool {
        !matches!(self, Self::Exclusive)
    }

    /// Whether a hold of this kind has a fencing token: readers write nothing, so only
    /// a writer (or a plain lock) is fenced.
    pub(crate) fn is_fenced(self) -> bool {
        self != Self::Read
    }
}

/// Suffix of a read-write lock's key (its holders' hash).
pub(crate) const READ_WRITE: &str = ":rw";

impl LockKeys {
    /// The escaped, joined name (what error messages show).
    pub fn name(&self) -> &str {
        let (from, to) = self.name_at;
        // Empty only if `key` was changed by hand since it was built.
        self.key.get(from as usize..to as usize).unwrap_or_default()
    }

    /// The fencing counter of the lock's hash slot (shared with the other locks of
    /// that slot).
    pub fn fence(&self) -> String {
        // The key is `<namespace>:{<name>}` and a namespace has no `{`.
        let namespace = self.key.split_once(":{").map_or("", |(ns, _)| ns);
        fence_key(namespace, cluster_slot(&self.key))
    }

    /// Present while someone waits for the lock: a release publishes only then.
    pub fn waiters(&self) -> String {
        suffixed(&self.key, WAITERS)
    }

    /// The pub/sub channel a release is announced on.
    pub fn channel(&self) -> String {
        suffixed(&self.key, RELEASED)
    }
}

/// Suffix of a lock's waiter marker.
pub(crate) const WAITERS: &str = ":waiters";
/// Suffix of a lock's release channel.
pub(crate) const RELEASED: &str = ":released";
/// Suffix of a fair lock's line (a list of waiting owners).
pub(crate) const QUEUE: &str = ":queue";
/// Suffix of a fair lock's deadlines (a sorted set: owner -> when its place lapses).
pub(crate) const TIMEOUTS: &str = ":timeouts";

/// `key` followed by `suffix`, in one allocation.
pub(crate) fn suffixed(key: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(key.len() + suffix.len());
    s.push_str(key);
    s.push_str(suffix);
    s
}

/// Checks a namespace (see [`LockConfig::with_namespace`](crate::LockConfig::with_namespace)).
pub(crate) fn validate_namespace(ns: &str) -> Result<(), LockError> {
    if ns.is_empty() {
        return Err(LockError::InvalidConfig(
            "the key namespace is empty".into(),
        ));
    }
    if ns.len() > MAX_NAMESPACE_LEN {
        return Err(LockError::InvalidConfig(format!(
            "the key namespace is {} bytes long; at most {MAX_NAMESPACE_LEN} are allowed",
            ns.len()
        )));
    }
    if let Some(c) = ns
        .chars()
        .find(|&c| reserved(c) || c.is_whitespace() || c.is_control())
    {
        return Err(LockError::InvalidConfig(format!(
            "the key namespace `{ns}` contains {c:?}; use letters, digits and `:_-.`"
        )));
    }
    // Its lock named by a slot tag would be the fencing counter of the namespace before
    // `:fence` (see the layout above).
    if ns.ends_with(FENCE_SEGMENT) {
        return Err(LockError::InvalidConfig(format!(
            "the key namespace `{ns}` ends in `{FENCE_SEGMENT}`, where the namespace before \
             it keeps its fencing counters; choose another last segment"
        )));
    }
    Ok(())
}

/// What follows a namespace in its fencing counters' keys (before the slot's hash tag).
const FENCE_SEGMENT: &str = ":fence";

/// Checks a delimiter (see [`LockConfig::with_delimiter`](crate::LockConfig::with_delimiter)).
pub(crate) fn validate_delimiter(d: &str) -> Result<(), LockError> {
    if d.is_empty() || d.len() > 8 || d.chars().any(reserved) {
        return Err(LockError::InvalidConfig(format!(
            "the key delimiter {d:?} must be 1 to 8 bytes without `{{`, `}}` or `%`"
        )));
    }
    Ok(())
}

/// Builds the keys of the lock `name` under `namespace`: the one place keys are made.
pub fn lock_keys<N: LockName + ?Sized>(
    namespace: &str,
    delimiter: &str,
    name: &N,
) -> Result<LockKeys, LockError> {
    let mut key = String::with_capacity(namespace.len() + 64);
    key.push_str(namespace);
    key.push_str(":{");
    let start = key.len();
    let mut key = write_name(delimiter, name, key)?;
    let end = key.len();
    key.push('}');
    Ok(LockKeys {
        hash: local_hash(&key),
        key,
        name_at: (start as u32, end as u32),
        mode: LockMode::Exclusive,
    })
}

/// The keys of the lock whose name is `name`, already escaped, under `namespace`.
pub(crate) fn escaped_lock_keys(namespace: &str, name: &str) -> LockKeys {
    let mut key = String::with_capacity(namespace.len() + name.len() + 3);
    key.push_str(namespace);
    key.push_str(":{");
    let start = key.len();
    key.push_str(name);
    let end = key.len();
    key.push('}');
    LockKeys {
        hash: local_hash(&key),
        key,
        name_at: (start as u32, end as u32),
        mode: LockMode::Exclusive,
    }
}

impl LockKeys {
    /// These keys for a hold of kind `mode`: a read-write lock's keys sit beside the
    /// plain lock's (same hash slot, a suffix of their own).
    pub(crate) fn with_mode(mut self, mode: LockMode) -> Self {
        if mode.is_read_write() {
            self.key.push_str(READ_WRITE);
            self.hash = local_hash(&self.key);
        }
        self.mode = mode;
        self
    }

    /// The kind of hold these keys are for.
    pub fn mode(&self) -> LockMode {
        self.mode
    }
}

/// The fencing counter of hash slot `slot` under `namespace`.
pub(crate) fn fence_key(namespace: &str, slot: u16) -> String {
    format!("{namespace}{FENCE_SEGMENT}:{{{}}}", slot_tag(slot))
}

/// The shortest decimal number whose CRC16 falls in `slot`: a hash tag that places a
/// key in that slot. Computed once for all 16384 slots (a few milliseconds).
pub(crate) fn slot_tag(slot: u16) -> u32 {
    static TAGS: std::sync::LazyLock<Vec<u32>> = std::sync::LazyLock::new(|| {
        let mut tags = vec![u32::MAX; 16384];
        let mut missing = tags.len();
        let mut n: u32 = 0;
        let mut buf = String::new();
        while missing > 0 {
            buf.clear();
            let _ = write!(buf, "{n}");
            let s = usize::from(crc16_xmodem(buf.as_bytes()) % 16384);
            if tags[s] == u32::MAX {
                tags[s] = n;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    TAGS[usize::from(slot % 16384)]
}

/// The keys of a fenced resource: its value and the highest token it has accepted.
/// Derived from the resource's lock keys, so they share its hash slot.
pub(crate) fn fenced_keys<N: LockName + ?Sized>(
    namespace: &str,
    delimiter: &str,
    resource: &N,
) -> Result<(String, String), LockError> {
    let base = lock_keys(namespace, delimiter, resource)?.key;
    Ok((
        suffixed(&base, ":fenced-value"),
        suffixed(&base, ":fenced-token"),
    ))
}

/// The escaped, joined parts of `name` alone (a store whose layout is not Redis's).
#[cfg_attr(
    not(any(
        test,
        feature = "postgres",
        feature = "mysql",
        feature = "zookeeper",
        feature = "etcd"
    )),
    allow(dead_code)
)]
pub(crate) fn escaped_name<N: LockName + ?Sized>(
    delimiter: &str,
    name: &N,
) -> Result<String, LockError> {
    write_name(delimiter, name, String::with_capacity(48))
}

/// `out` followed by the escaped, joined parts of `name`, checked.
fn write_name<N: LockName + ?Sized>(
    delimiter: &str,
    name: &N,
    out: String,
) -> Result<String, LockError> {
    let start = out.len();
    let mut w = NameWriter {
        delimiter,
        out,
        parts: 0,
        empty_part: None,
        mangled: false,
        min_parts: 1,
    };
    name.write_parts(&mut w);
    if w.mangled {
        return Err(LockError::InvalidKey(
            "a part of the lock name removed text before it: `KeyPart::write_part` may \
             only append to the string it is given"
                .into(),
        ));
    }
    if w.parts == 0 {
        return Err(LockError::InvalidKey(
            "a lock name needs at least one part".into(),
        ));
    }
    if w.parts < w.min_parts {
        return Err(LockError::InvalidKey(
            "a key needs at least one part of its own: this one has none".into(),
        ));
    }
    if let Some(i) = w.empty_part {
        return Err(LockError::InvalidKey(format!(
            "part {} of the lock name is empty; every part must have at least one character",
            i + 1
        )));
    }
    let len = w.out.len() - start;
    if len > MAX_NAME_LEN {
        return Err(LockError::InvalidKey(format!(
            "the lock name is {len} bytes long after escaping; at most {MAX_NAME_LEN} are allowed"
        )));
    }
    Ok(w.out)
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of its hash tag (the text
/// between the first `{` and the next `}`, when not empty), or of the whole key, modulo
/// 16384. The watchdog uses it to batch renewals per slot on a cluster.
pub(crate) fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16_xmodem(tagged.unwrap_or(bytes)) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn cluster_slot_is_crc16_xmodem_of_the_hash_tag() {
        // The CRC-16/XMODEM check value from the catalogue of CRC parameters.
        assert_eq!(super::crc16_xmodem(b"123456789"), 0x31C3);
        // The Redis Cluster specification: only the tag counts, an empty tag does not.
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("user1000")
        );
        assert_eq!(cluster_slot("a{user1000}b"), cluster_slot("user1000"));
        assert_ne!(cluster_slot("{}user1000"), cluster_slot("user1000"));
        assert_eq!(
            cluster_slot("{}user1000"),
            super::crc16_xmodem(b"{}user1000") % 16384
        );
        let keys = lock_keys("lock", ":", &("order", 7_u64)).unwrap();
        assert_eq!(cluster_slot(&keys.key), cluster_slot(&keys.fence()));
        assert_eq!(cluster_slot(&keys.key), cluster_slot(&keys.channel()));
        assert_eq!(cluster_slot(&keys.key), cluster_slot(&keys.waiters()));
    }

    #[test]
    fn every_slot_has_a_fence_tag_in_it() {
        for slot in 0..16384u16 {
            let key = fence_key("ns", slot);
            assert_eq!(cluster_slot(&key), slot, "{key}");
        }
        // Many names share a slot's counter: the counters are bounded by the slots.
        let a = lock_keys("lock", ":", "a").unwrap();
        assert_eq!(a.fence(), fence_key("lock", cluster_slot(&a.key)));
        // A namespace with colons: the fence key keeps all of it.
        let b = lock_keys("app:locks", ":", "a").unwrap();
        assert_eq!(b.fence(), fence_key("app:locks", cluster_slot(&b.key)));
    }

    use super::*;

    fn keys<N: LockName + ?Sized>(n: &N) -> LockKeys {
        lock_keys("lock", ":", n).unwrap()
    }

    #[test]
    fn layout_shares_one_hash_tag() {
        let k = keys(&("order", 42_u64));
        assert_eq!(k.key, "lock:{order:42}");
        assert_eq!(k.name(), "order:42");
        assert_eq!(k.waiters(), "lock:{order:42}:waiters");
        assert!(k.fence().starts_with("lock:fence:{"), "{}", k.fence());
        assert_eq!(k.channel(), "lock:{order:42}:released");
    }

    #[test]
    fn parts_cannot_forge_other_keys() {
        // Delimiter inside a part vs. two parts.
        assert_ne!(keys(&("a:b",)).key, keys(&("a", "b")).key);
        // Braces cannot close the hash tag or reach another lock's fence key.
        let forged = keys("x}:fence");
        assert_eq!(forged.key, "lock:{x%7D%3Afence}");
        assert_ne!(forged.key, keys("x").waiters());
        // The escape character itself is escaped, so escapes cannot be forged.
        assert_ne!(keys("%3A").key, keys(":").key);
        for k in [keys("{a}"), keys(&("}", "{")), keys("%7B")] {
            assert_eq!(k.key.matches('{').count(), 1, "{k:?}");
            assert_eq!(k.key.matches('}').count(), 1, "{k:?}");
        }
    }

    /// The escaping by definition, one character at a time.
    fn escaped_by_definition(delimiter: &str, parts: &[String]) -> String {
        let mut out = Vec::new();
        for p in parts {
            let mut e = String::new();
            for c in p.chars() {
                if matches!(c, '%' | '{' | '}') || delimiter.contains(c) {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        e.push_str(&format!("%{b:02X}"));
                    }
                } else {
                    e.push(c);
                }
            }
            out.push(e);
        }
        out.join(delimiter)
    }

    #[test]
    fn escaping_matches_its_definition_for_random_parts_and_delimiters() {
        let alphabet = [
            'a', 'Z', '0', ':', '/', '%', '{', '}', '-', 'é', '→', '😀', ' ',
        ];
        let delimiters = [":", "/", "::", "-", "é", "→:"];
        let mut rng = fastrand::Rng::with_seed(42);
        for _ in 0..5000 {
            let delimiter = delimiters[rng.usize(..delimiters.len())];
            let parts: Vec<String> = (0..rng.usize(1..4))
                .map(|_| {
                    (0..rng.usize(1..40))
                        .map(|_| alphabet[rng.usize(..alphabet.len())])
                        .collect()
                })
                .collect();
            let got = escaped_name(delimiter, parts.as_slice()).unwrap();
            assert_eq!(
                got,
                escaped_by_definition(delimiter, &parts),
                "{parts:?} {delimiter:?}"
            );
        }
    }

    #[test]
    fn custom_delimiter_is_escaped_in_parts() {
        let a = lock_keys("ns", "/", &("a/b",)).unwrap();
        let b = lock_keys("ns", "/", &("a", "b")).unwrap();
        assert_eq!(a.key, "ns:{a%2Fb}");
        assert_eq!(b.key, "ns:{a/b}");
    }

    #[test]
    fn bad_names_are_rejected() {
        let empty: [&str; 0] = [];
        assert!(
            lock_keys("lock", ":", &empty)
                .unwrap_err()
                .is_invalid_input()
        );
        let e = lock_keys("lock", ":", "").unwrap_err();
        assert!(e.to_string().contains("part 1"), "{e}");
        let e = lock_keys("lock", ":", &("a", "")).unwrap_err();
        assert!(e.to_string().contains("part 2"), "{e}");
        let long = "x".repeat(MAX_NAME_LEN + 1);
        let e = lock_keys("lock", ":", long.as_str()).unwrap_err();
        assert!(e.to_string().contains("1025 bytes"), "{e}");
        assert!(lock_keys("lock", ":", "x".repeat(MAX_NAME_LEN).as_str()).is_ok());
    }

    #[test]
    fn namespace_and_delimiter_are_checked() {
        assert!(validate_namespace("lock").is_ok());
        assert!(validate_namespace("app:locks").is_ok());
        for bad in ["", "a{b", "a}", "a b", "100%", "lock:fence", "fence:fence"] {
            assert!(validate_namespace(bad).is_err(), "{bad:?}");
        }
        // Only as the last segment.
        assert!(validate_namespace("lock:fence:x").is_ok());
        assert!(validate_namespace("lock:fences").is_ok());
        // The clash it prevents: that namespace's lock `0` is `lock`'s counter.
        let clash = lock_keys("lock:fence", ":", "0").unwrap();
        assert_eq!(clash.key, fence_key("lock", cluster_slot(&clash.key)));
        assert!(validate_delimiter(":").is_ok());
        for bad in ["", "{", "%", "123456789"] {
            assert!(validate_delimiter(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_part_that_removes_text_before_it_is_an_error_not_a_panic() {
        struct Eraser(usize);
        impl KeyPart for Eraser {
            fn write_part(&self, out: &mut String) {
                out.truncate(out.len().saturating_sub(self.0));
                out.push('é');
            }
        }
        for erase in [1, 3, 100] {
            let e = lock_keys("lock", ":", &("a", Eraser(erase))).unwrap_err();
            assert!(e.is_invalid_input(), "{e}");
            assert!(e.to_string().contains("only append"), "{e}");
        }
        // A character written over where the part began, longer than what it replaced.
        struct Straddler;
        impl KeyPart for Straddler {
            fn write_part(&self, out: &mut String) {
                out.pop();
                out.push_str("éx");
            }
        }
        let e = lock_keys("lock", ":", &("a", Straddler)).unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        // Appending only is fine, escaped like any part.
        assert_eq!(keys(&("a", Eraser(0))).key, "lock:{a:é}");
    }

    #[test]
    fn the_name_is_read_out_of_the_key_for_every_mode() {
        let k = keys(&("order", "a:b"));
        assert_eq!(k.name(), "order:a%3Ab");
        let rw = k.clone().with_mode(LockMode::Write);
        assert_eq!(rw.key, "lock:{order:a%3Ab}:rw");
        assert_eq!(rw.name(), "order:a%3Ab");
        let node = escaped_lock_keys("other", k.name());
        assert_eq!(node.key, "other:{order:a%3Ab}");
        assert_eq!(node.name(), k.name());
        let debug = format!("{k:?}");
        assert!(debug.contains(r#"name: "order:a%3Ab""#), "{debug}");
    }

    #[test]
    fn key_parts_of_every_kind() {
        assert_eq!(keys(&(1_i8, -2_i64, true, 'c')).key, "lock:{1:-2:true:c}");
        assert_eq!(keys(&vec![String::from("a"), "b".into()]).key, "lock:{a:b}");
        assert_eq!(keys(&["x"; 3]).key, "lock:{x:x:x}");
    }
}
