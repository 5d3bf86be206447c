//! The stored response: status, headers (minus hop-by-hop and denied ones), body and
//! trailers (gRPC's status is one), in one binary record.
//!
//! Layout (all integers big-endian), with `fields` = `count:u32 { name_len:u32 name
//! value_len:u32 value }*`:
//!
//! ```text
//! "IR1"  status:u16  headers:fields  body...
//! "IR2"  status:u16  headers:fields  trailers:fields  body...
//! ```
//!
//! A response without trailers is written as `IR1`, which every version reads.

use bytes::Bytes;
use http::header::{CONNECTION, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode, response};

const MAGIC: &[u8; 3] = b"IR1";
const MAGIC_TRAILERS: &[u8; 3] = b"IR2";

/// Headers that describe one connection, never a resource (RFC 9110 section 7.6.1).
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
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

/// The fields of `fields` that are stored, as bytes (`connection`: the headers, whose
/// `Connection` names fields of one connection only).
fn kept<'a>(
    fields: &'a HeaderMap,
    connection: &HeaderMap,
    deny: &[HeaderName],
) -> Vec<(&'a [u8], &'a [u8])> {
    fields
        .iter()
        .filter(|(name, _)| stored(name, connection, deny))
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect()
}

/// The record of a response: its head, `body` and `trailers`.
pub(crate) fn encode(
    parts: &response::Parts,
    body: &[u8],
    trailers: Option<&HeaderMap>,
    deny: &[HeaderName],
) -> Vec<u8> {
    let headers = kept(&parts.headers, &parts.headers, deny);
    let trailers = trailers
        .map(|t| kept(t, &parts.headers, deny))
        .filter(|t| !t.is_empty());
    let size = |fields: &[(&[u8], &[u8])]| {
        fields
            .iter()
            .map(|(n, v)| 8 + n.len() + v.len())
            .sum::<usize>()
    };
    let mut out =
        Vec::with_capacity(13 + size(&headers) + trailers.as_deref().map_or(0, size) + body.len());
    out.extend_from_slice(if trailers.is_some() {
        MAGIC_TRAILERS
    } else {
        MAGIC
    });
    out.extend_from_slice(&parts.status.as_u16().to_be_bytes());
    for fields in std::iter::once(&headers).chain(trailers.as_ref()) {
        out.extend_from_slice(&(fields.len() as u32).to_be_bytes());
        for (name, value) in fields {
            for field in [name, value] {
                out.extend_from_slice(&(field.len() as u32).to_be_bytes());
                out.extend_from_slice(field);
            }
        }
    }
    out.extend_from_slice(body);
    out
}

/// A decoded record: status, headers in their stored order, body, trailers.
#[derive(Debug)]
pub(crate) struct Stored {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) trailers: Option<HeaderMap>,
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
    let with_trailers = match take(3)? {
        m if m == MAGIC => false,
        m if m == MAGIC_TRAILERS => true,
        _ => return None,
    };
    let status = StatusCode::from_u16(u16::from_be_bytes(take(2)?.try_into().ok()?)).ok()?;
    let mut fields = || {
        let count = u32::from_be_bytes(take(4)?.try_into().ok()?);
        let mut map = HeaderMap::new();
        for _ in 0..count {
            let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
            let name = HeaderName::from_bytes(take(len)?).ok()?;
            let len = u32::from_be_bytes(take(4)?.try_into().ok()?) as usize;
            let value = HeaderValue::from_bytes(take(len)?).ok()?;
            map.append(name, value);
        }
        Some(map)
    };
    let headers = fields()?;
    let trailers = if with_trailers { Some(fields()?) } else { None };
    let body = record.slice(at..);
    Some(Stored {
        status,
        headers,
        body,
        trailers,
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
        let record = encode(&parts, b"{\"id\":1}", None, &deny);
        assert_eq!(
            &record[..3],
            b"IR1",
            "no trailers: the layout every version reads"
        );
        let stored = decode(record).unwrap();
        assert!(stored.trailers.is_none());
        assert_eq!(stored.status, 201);
        assert_eq!(&stored.body[..], b"{\"id\":1}");
        let names: Vec<_> = stored.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "x-order"]);
        let orders: Vec<_> = stored.headers.get_all("x-order").iter().collect();
        assert_eq!(orders, ["1", "2"]);
    }

    #[test]
    fn trailers_are_kept_after_the_headers_minus_denied_ones() {
        let (parts, ()) = http::Response::builder()
            .status(200)
            .header("content-type", "application/grpc")
            .body(())
            .unwrap()
            .into_parts();
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        trailers.append("x-note", HeaderValue::from_static("a"));
        trailers.append("x-note", HeaderValue::from_static("b"));
        trailers.insert("set-cookie", HeaderValue::from_static("s=1"));
        let deny = [HeaderName::from_static("set-cookie")];
        let record = encode(&parts, b"\0\0\0\0\x02hi", Some(&trailers), &deny);
        assert_eq!(&record[..3], b"IR2");
        let stored = decode(record.clone()).unwrap();
        assert_eq!(stored.status, 200);
        assert_eq!(stored.headers.len(), 1);
        assert_eq!(&stored.body[..], b"\0\0\0\0\x02hi");
        let kept = stored.trailers.unwrap();
        assert_eq!(kept.len(), 3, "{kept:?}");
        assert_eq!(kept["grpc-status"], "0");
        let notes: Vec<_> = kept.get_all("x-note").iter().collect();
        assert_eq!(notes, ["a", "b"]);
        // Cut anywhere before the body (inside the headers or the trailers): not a record.
        let body_at = record.len() - 7;
        for cut in 3..body_at {
            if let Some(s) = decode(record[..cut].to_vec()) {
                panic!("a record cut at {cut} of {body_at} decoded: {s:?}");
            }
        }
        // Only denied trailers: the layout without trailers.
        let mut denied = HeaderMap::new();
        denied.insert("set-cookie", HeaderValue::from_static("s=1"));
        let record = encode(&parts, b"x", Some(&denied), &deny);
        assert_eq!(&record[..3], b"IR1");
        assert!(decode(record).unwrap().trailers.is_none());
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
