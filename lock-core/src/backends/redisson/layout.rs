//! The keys and channels of Redisson's layout, built from a lock's name (the escaped,
//! joined name, without this crate's namespace: what a Java service passes to
//! `redisson.getLock(name)`).
//!
//! Redisson wraps the name in a hash tag (`prefix:{name}`) unless it has one already
//! (`prefix:name`); the lock's own key is the bare name, whose slot is the tag's, so
//! every key of one lock lands in one hash slot of a Cluster.

/// `<prefix>:{<name>}` (or `<prefix>:<name>` for a name with a `{`): Redisson's
/// `prefixName`.
pub(super) fn prefixed(prefix: &str, name: &str) -> String {
    let mut s = String::with_capacity(prefix.len() + name.len() + 3);
    s.push_str(prefix);
    s.push(':');
    push_tagged(&mut s, name);
    s
}

/// `{<name>}:<suffix>` (or `<name>:<suffix>` for a name with a `{`): Redisson's
/// `suffixName`.
pub(super) fn suffixed(name: &str, suffix: &str) -> String {
    let mut s = String::with_capacity(name.len() + suffix.len() + 3);
    push_tagged(&mut s, name);
    s.push(':');
    s.push_str(suffix);
    s
}

/// `{<name>}`, or the name alone when it has a `{`.
pub(super) fn tagged(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 2);
    push_tagged(&mut s, name);
    s
}

fn push_tagged(s: &mut String, name: &str) {
    if name.contains('{') {
        s.push_str(name);
    } else {
        s.push('{');
        s.push_str(name);
        s.push('}');
    }
}

/// `<prefix>:{<name>}:<id>`: a key per request (the unlock latch, a grant's evidence).
pub(super) fn per_request(prefix: &str, name: &str, request: &str) -> String {
    let mut s = prefixed(prefix, name);
    s.push(':');
    s.push_str(request);
    s
}

/// Where a plain or fair lock's release is announced (a fair waiter listens on
/// `<channel>:<field>`).
pub(super) const LOCK_CHANNEL: &str = "redisson_lock__channel";
/// Where a read-write lock's release is announced.
pub(super) const READ_WRITE_CHANNEL: &str = "redisson_rwlock";
/// An unlock's answer, kept for its retry: `<latch>:{<name>}:<request id>`.
pub(super) const UNLOCK_LATCH: &str = "redisson_unlock_latch";
/// This crate's evidence that an acquisition granted (Java ignores it).
pub(super) const GRANT: &str = "redisson_lock_grant";
/// The fencing counter of a lock.
pub(super) const TOKEN: &str = "redisson_lock_token";
/// A fair lock's queue of waiting fields.
pub(super) const QUEUE: &str = "redisson_lock_queue";
/// A fair lock's deadlines of waiting fields.
pub(super) const TIMEOUT: &str = "redisson_lock_timeout";

/// A Redisson client id's text: the 16 bytes of `hex` (32 hex digits) as a UUID,
/// `8-4-4-4-12`.
pub(super) fn uuid(hex: &str) -> String {
    let mut s = String::with_capacity(36);
    for (i, c) in hex.chars().enumerate() {
        if matches!(i, 8 | 12 | 16 | 20) {
            s.push('-');
        }
        s.push(c);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_wrapped_in_a_hash_tag_unless_they_have_one() {
        assert_eq!(
            prefixed(LOCK_CHANNEL, "order:42"),
            "redisson_lock__channel:{order:42}"
        );
        assert_eq!(prefixed(QUEUE, "a{b}"), "redisson_lock_queue:a{b}");
        assert_eq!(suffixed("x", "f:rwlock_timeout"), "{x}:f:rwlock_timeout");
        assert_eq!(suffixed("{x}y", "s"), "{x}y:s");
        assert_eq!(
            per_request(UNLOCK_LATCH, "x", "r1"),
            "redisson_unlock_latch:{x}:r1"
        );
        assert_eq!(tagged("x"), "{x}");
        assert_eq!(
            uuid("0123456789abcdef0123456789abcdef"),
            "01234567-89ab-cdef-0123-456789abcdef"
        );
    }
}
