//! Where the idempotency key comes from, and what a well-formed key is.

use http::{HeaderName, Request};

/// Longest accepted idempotency key, in characters (all printable ASCII).
pub const MAX_KEY_LEN: usize = 255;

/// Derives the idempotency key of a request.
///
/// `Ok(None)`: the request carries no key (400 when keys are
/// [required](super::IdempotencyLayer::require_key), otherwise it passes unprotected).
/// `Err(reason)`: the key is malformed; the request gets 400 problem+json with `reason`.
/// Every key is then checked by the layer: 1 to [`MAX_KEY_LEN`] printable ASCII
/// characters (space included).
///
/// Implemented by [`HeaderKey`] (the default: the `Idempotency-Key` header) and for
/// closures `Fn(&Request<B>) -> Option<String>`:
///
/// ```
/// use http::Request;
/// use lock_tower::idempotency::ExtractKey;
///
/// // A key made of two headers.
/// let from_headers = |r: &Request<()>| {
///     let h = |n: &str| r.headers().get(n)?.to_str().ok().map(str::to_owned);
///     Some(format!("{}.{}", h("x-client")?, h("x-request-number")?))
/// };
/// let r = Request::post("/").header("x-client", "shop").header("x-request-number", "7").body(()).unwrap();
/// assert_eq!(from_headers.extract_key(&r), Ok(Some("shop.7".to_string())));
/// ```
pub trait ExtractKey<B> {
    /// The key of `request`.
    fn extract_key(&self, request: &Request<B>) -> Result<Option<String>, String>;
}

impl<B, F> ExtractKey<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn extract_key(&self, request: &Request<B>) -> Result<Option<String>, String> {
        Ok(self(request))
    }
}

/// The key from one request header: `Idempotency-Key` by default.
///
/// Behavior: the value is an RFC 8941 sf-string, as the IETF draft
/// (draft-ietf-httpapi-idempotency-key-header) says: `"8e03978e-40d5"` or `"a b"`,
/// printable ASCII with `\"` and `\\` escapes. As a leniency, a bare sf-token is
/// accepted too (`order-1`: a letter or `*`, then letters, digits and
/// ``!#$%&'*+-.^_`|~:/``). Other structured items (`12345`, `:YWJj:`, `?1`),
/// parameters (`;a=1`) or the header twice are malformed.
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

impl<B> ExtractKey<B> for HeaderKey {
    fn extract_key(&self, request: &Request<B>) -> Result<Option<String>, String> {
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

/// An RFC 8941 sf-string (the draft's syntax) or, leniently, a bare sf-token. Other
/// structured items (integers, byte sequences, booleans, ...) are refused by name.
fn parse_value(value: &str) -> Result<String, String> {
    let quote_it = |what: &str| {
        Err(format!(
            "is {what}; the key must be a quoted string, e.g. \"{value}\""
        ))
    };
    let Some(first) = value.chars().next() else {
        return Err("is empty".into());
    };
    match first {
        '"' => parse_string(&value[1..]),
        c if c.is_ascii_alphabetic() || c == '*' => {
            match value.chars().find(|c| !is_token_char(*c)) {
                None => Ok(value.to_owned()),
                Some(c) => Err(format!(
                    "is neither a quoted string nor a bare token; {c:?} is not allowed in a token"
                )),
            }
        }
        c if c.is_ascii_digit() || c == '-' => quote_it("a number"),
        ':' => quote_it("a byte sequence"),
        '?' => quote_it("a boolean"),
        _ => Err("must be a quoted string (an RFC 8941 sf-string)".into()),
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
        HeaderKey::default().extract_key(&b.body(()).unwrap())
    }

    #[test]
    fn quoted_strings_and_tokens() {
        assert_eq!(extract(&[]), Ok(None));
        assert_eq!(extract(&["\"abc-1\""]), Ok(Some("abc-1".into())));
        assert_eq!(extract(&[r#""a\"b\\c""#]), Ok(Some(r#"a"b\c"#.into())));
        assert_eq!(extract(&["\"a b\""]), Ok(Some("a b".into())));
        assert!(validate("a b").is_ok());
        assert_eq!(
            extract(&["\"8e03978e-40d5\""]),
            Ok(Some("8e03978e-40d5".into()))
        );
        assert_eq!(extract(&["order-1"]), Ok(Some("order-1".into())));
        assert_eq!(extract(&["  tok  "]), Ok(Some("tok".into())));
        for bad in [
            "\"abc",
            "\"a\"b",
            "\"a\\nb\"",
            "a,b",
            "a;x=1",
            "\"a\";x=1",
            "a b",
            "12345",
            ":YWJj:",
            "?1",
            "8e03978e-40d5",
            "",
        ] {
            assert!(extract(&[bad]).is_err(), "{bad:?}");
        }
        assert!(extract(&["12345"]).unwrap_err().contains("a number"));
        assert!(extract(&["a", "b"]).unwrap_err().contains("more than once"));
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
