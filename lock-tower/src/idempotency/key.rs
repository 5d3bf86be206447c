//! The `Idempotency-Key` header, and what a well-formed key is.

use http::{HeaderName, Request};

use crate::KeyExtractor;

/// Longest accepted idempotency key, in characters (all printable ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// The key from one request header: `Idempotency-Key` by default.
///
/// Behavior: the value is an RFC 8941 sf-string, as the IETF draft
/// (draft-ietf-httpapi-idempotency-key-header) says: `"8e03978e-40d5"` or `"a b"`,
/// printable ASCII with `\"` and `\\` escapes. As a leniency (Stripe's clients send
/// unquoted UUIDs), a bare value is taken literally when it is made of letters, digits
/// and ``!#$%&'*+-.^_`|~:/`` only, whatever its first character: `8e03978e-40d5`,
/// `12345`, `order-1`. A bare value and its quoted form are the same key, since they
/// denote the same string. Anything else is malformed: an empty value, a bare value
/// with other characters (`a b`, `?1`, `(a b)`), parameters (`a;x=1`, `"a";x=1`), or
/// the header twice.
#[derive(Debug, Clone)]
pub struct HeaderKey(HeaderName);

impl HeaderKey {
    /// The key from the header `name`.
    pub fn new(name: HeaderName) -> Self {
        Self(name)
    }

    /// The header read.
    pub fn header(&self) -> &HeaderName {
        &self.0
    }
}

impl Default for HeaderKey {
    /// `Idempotency-Key`.
    fn default() -> Self {
        Self(HeaderName::from_static("idempotency-key"))
    }
}

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
        let mut values = request.headers().get_all(&self.0).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(format!("the {} header appears more than once", self.0));
        }
        let value = value
            .to_str()
            .map_err(|_| format!("the {} header is not visible ASCII", self.0))?;
        parse_value(value.trim_matches(|c| c == ' ' || c == '\t'))
            .map(Some)
            .map_err(|why| format!("the {} header {why}", self.0))
    }
}

/// An RFC 8941 sf-string (the draft's syntax) or, leniently, a bare key taken literally.
/// A bare value with a character no token holds (a parameter's `;`, a list's `,` or
/// `(`, a boolean's `?`, a space) is refused.
fn parse_value(value: &str) -> Result<String, String> {
    if value.is_empty() {
        return Err("is empty".into());
    }
    if let Some(quoted) = value.strip_prefix('"') {
        return parse_string(quoted);
    }
    // Bare: any run of token characters, so that unquoted UUIDs and numbers are keys
    // even where an sf parser would read an integer.
    match value.chars().find(|c| !is_token_char(*c)) {
        None => Ok(value.to_owned()),
        Some(c) => Err(format!(
            "has {c:?}, which a bare key cannot hold; quote the key (an RFC 8941 \
             sf-string) to use it"
        )),
    }
}

/// The rest of an sf-string after its opening quote: printable ASCII, `\"` and `\\`
/// escapes, and nothing after the closing quote.
fn parse_string(quoted: &str) -> Result<String, String> {
    let mut out = String::with_capacity(quoted.len());
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err("has an escape other than \\\" or \\\\".into()),
            },
            '"' if chars.as_str().is_empty() => return Ok(out),
            '"' => return Err("has text after the closing quote".into()),
            c if (' '..='~').contains(&c) => out.push(c),
            c => return Err(format!("has {c:?}, which a quoted string cannot hold")),
        }
    }
    Err("has no closing quote".into())
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~:/".contains(c)
}

/// 1 to [`MAX_KEY_LEN`] printable ASCII characters (space to `~`, what an sf-string
/// can hold).
pub(crate) fn validate(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err("the idempotency key is empty".into());
    }
    if let Some(c) = key.chars().find(|c| !(' '..='~').contains(c)) {
        return Err(format!(
            "the idempotency key contains {c:?}; only printable ASCII characters are allowed"
        ));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(format!(
            "the idempotency key is {} characters long; at most {MAX_KEY_LEN} are allowed",
            key.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extract(values: &[&str]) -> Result<Option<String>, String> {
        let mut b = Request::post("/");
        for v in values {
            b = b.header("idempotency-key", *v);
        }
        HeaderKey::default().extract(&b.body(()).unwrap())
    }

    #[test]
    fn quoted_strings_and_bare_keys() {
        assert_eq!(extract(&[]), Ok(None));
        assert_eq!(extract(&["\"abc-1\""]), Ok(Some("abc-1".into())));
        assert_eq!(extract(&[r#""a\"b\\c""#]), Ok(Some(r#"a"b\c"#.into())));
        assert_eq!(extract(&["\"a b\""]), Ok(Some("a b".into())));
        assert!(validate("a b").is_ok());
        assert_eq!(extract(&["order-1"]), Ok(Some("order-1".into())));
        assert_eq!(extract(&["  tok  "]), Ok(Some("tok".into())));
        // Bare keys are taken literally, whatever their first character.
        for bare in [
            "12345",
            "8e03978e-40d5",
            "-1",
            "1.5",
            ":YWJj:",
            "*x",
            "a/b:c",
        ] {
            assert_eq!(extract(&[bare]), Ok(Some(bare.into())), "{bare:?}");
        }
        for bad in [
            "\"abc",
            "\"a\"b",
            "\"a\\nb\"",
            "a,b",
            "a;x=1",
            "\"a\";x=1",
            "(a b)",
            "a b",
            "?1",
            "",
        ] {
            assert!(extract(&[bad]).is_err(), "{bad:?}");
        }
        let e = extract(&["a;x=1"]).unwrap_err();
        assert!(e.contains("';'") && e.contains("quote"), "{e}");
        assert!(extract(&["a", "b"]).unwrap_err().contains("more than once"));
    }

    /// A UUID starting with each hex digit, bare and quoted: one key.
    #[test]
    fn uuids_are_keys_whatever_their_first_digit() {
        for first in "0123456789abcdef".chars() {
            let id = format!("{first}e03978e-40d5-4e2a-9c1b-7f61a2b3c4d5");
            let quoted = format!("\"{id}\"");
            assert_eq!(extract(&[&id]), Ok(Some(id.clone())));
            assert_eq!(extract(&[&quoted]), Ok(Some(id.clone())));
        }
    }

    #[test]
    fn length_and_characters() {
        assert!(validate(&"k".repeat(MAX_KEY_LEN)).is_ok());
        let e = validate(&"k".repeat(MAX_KEY_LEN + 1)).unwrap_err();
        assert!(e.contains("256 characters"), "{e}");
        assert!(validate("").is_err());
        assert!(validate("é").is_err());
        assert!(validate("tab\there").is_err());
    }
}
