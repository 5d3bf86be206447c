//! The stored response: status, headers (minus hop-by-hop and denied ones) and body, in
//! one binary record.
//!
//! Layout (all integers big-endian):
//!
//! ```text
//! "IR1"  status:u16  headers:u32  { name_len:u32 name value_len:u32 value }*  body...
//! ```

use bytes::Bytes;
use http::header::{CONNECTION, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode, response};

const MAGIC: &[u8; 3] = b"IR1";

/// Headers that describe one connection, never a resource (RFC 9110 section 7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` is stored: not hop-by-hop, not named in `Connection`, not denied.
fn stored(name: &HeaderName, headers: &HeaderMap, deny: &[HeaderName]) -> bool {
    let listed_in_connection = headers.get_all(CONNECTION).iter().any(|v| {
        v.to_str()
            .unwrap_or("")
            .split(',')
            .any(|t| t.trim().eq_ignore_ascii_case(name.as_str()))
    });
    !HOP_BY_HOP.contains(&name.as_str()) && !listed_in_connection && !deny.contains(name)
}

/// The record of a response.
pub(crate) fn encode(parts: &response::Parts, body: &[u8], deny: &[HeaderName]) -> Vec<u8> {
    let kept = || {
        parts
            .headers
            .iter()
            .filter(|(name, _)| stored(name, &parts.headers, deny))
    };
    let (count, size) = kept().fold((0u32, 0usize), |(c, s), (n, v)| {
        (c + 1, s + 8 + n.as_str().len() + v.len())
    });
    let mut out = Vec::with_capacity(9 + size + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&parts.status.as_u16().to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
    for (name, value) in kept() {
        for field in [name.as_str().as_bytes(), value.as_bytes()] {
            out.extend_from_slice(&(field.len() as u32).to_be_bytes());
            out.extend_from_slice(field);
        }
    }
    out.extend_from_slice(body);
    out
}

/// A decoded record: status, headers in their stored order, body.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

/// Decodes a record; `None` if it is not one this module wrote.
pub(crate) fn decode(record: Vec<u8>) -> Option<Stored> {
    let record = Bytes::from(record);
    let mut at = 0usize;
    let mut take = |n: usize| {
        let field = record.get(at..at.checked_add(n)?)?;
        at += n;
        Some(field)
    };
    if take(3)? != MAGIC {
        return None;
    }
    let status = StatusCode::from_u16(u16::from_be_bytes(take(2)?.try_into().ok()?)).ok()?;
    let count = u32::from_be_bytes(take(4)?.try_into().ok()?);
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let name = HeaderName::from_bytes(take(len)?).ok()?;
        let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
        let value = HeaderValue::from_bytes(take(len)?).ok()?;
        headers.append(name, value);
    }
    let body = record.slice(at..);
    Some(Stored {
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_drops_hop_by_hop_and_denied_headers() {
        let (parts, ()) = http::Response::builder()
            .status(201)
            .header("content-type", "application/json")
            .header("x-order", "1")
            .header("x-order", "2")
            .header("connection", "x-conn-only")
            .header("x-conn-only", "a")
            .header("transfer-encoding", "chunked")
            .header("set-cookie", "s=1")
            .body(())
            .unwrap()
            .into_parts();
        let deny = [HeaderName::from_static("set-cookie")];
        let stored = decode(encode(&parts, b"{\"id\":1}", &deny)).unwrap();
        assert_eq!(stored.status, 201);
        assert_eq!(&stored.body[..], b"{\"id\":1}");
        let names: Vec<_> = stored.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-order"]);
        let orders: Vec<_> = stored.headers.get_all("x-order").iter().collect();
        assert_eq!(orders, ["1", "2"]);
    }

    #[test]
    fn garbage_is_not_a_record() {
        assert!(decode(b"nope".to_vec()).is_none());
        assert!(decode(b"IR1\x00".to_vec()).is_none());
        // Claims one header but ends.
        assert!(decode(b"IR1\x00\xc8\x00\x00\x00\x01\x00\x00".to_vec()).is_none());
        let empty = decode(b"IR1\x00\xcc\x00\x00\x00\x00".to_vec()).unwrap();
        assert_eq!(empty.status, 204);
        assert!(empty.body.is_empty());
    }
}
