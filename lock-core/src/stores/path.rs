//! Lock names as one segment of a store's path (a ZooKeeper node, an etcd key prefix):
//! a name holding `/` must not reach into another lock's path.

/// Percent-escapes `/`, `%` and the characters ZooKeeper refuses in a node name; `.`
/// and `..` (reserved) become `%2E` and `%2E%2E`.
pub(crate) fn segment(s: &str) -> String {
    escaped(s, |_| false)
}

/// [`segment`] for a ZooKeeper node: characters beyond U+FFFF are escaped too, since the
/// server reads a path as UTF-16 and refuses their surrogate halves (etcd keys keep
/// them as they are).
pub(crate) fn node(s: &str) -> String {
    escaped(s, |c| c > '\u{ffff}')
}

fn escaped(s: &str, also: impl Fn(char) -> bool) -> String {
    if s == "." || s == ".." {
        return s.replace('.', "%2E");
    }
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let refused = matches!(c, '/' | '%' | '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}')
            || matches!(c, '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}')
            || also(c);
        if refused {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_one_escaped_segment() {
        assert_eq!(segment("order:7"), "order:7");
        assert_eq!(segment("a/b"), "a%2Fb");
        assert_eq!(segment(".."), "%2E%2E");
        assert_eq!(segment("x\u{1}y"), "x%01y");
        assert_eq!(segment("50%"), "50%25");
        assert_eq!(segment("a\u{1f600}"), "a\u{1f600}");
        assert_eq!(node("a\u{1f600}"), "a%F0%9F%98%80");
        assert_eq!(node("a/b"), "a%2Fb");
    }
}
