//! RESP2 replies read from a buffer: what a command connection is answered with (no
//! RESP3 types: the connection never asks for them).
//!
//! A reply is parsed only once it is whole in the buffer (`Ok(None)` until then), so
//! the reader parses from the start of a reply each time more bytes arrive. Replies
//! are small here (a batch of at most 128 entries); an error reply is handed to
//! redis-rs's own parser, so its kind (`NOSCRIPT`, `MOVED`, ...) is read exactly as
//! redis-rs reads it everywhere else.

use redis::{ErrorKind, RedisError, Value};

/// How deep arrays may nest in one reply (redis-rs's own limit).
const MAX_DEPTH: usize = 100;

/// The largest bulk string or array a reply may announce (Redis's own `proto-max-bulk-len`
/// default is 512 MB); more is a broken stream, not a reply.
const MAX_LEN: usize = 512 * 1024 * 1024;

/// The first whole reply at the start of `buf` and the bytes it took, or `None` if it
/// is not all there yet.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, RedisError> {
    let mut at = 0;
    Ok(value(buf, &mut at, 0)?.map(|v| (v, at)))
}

/// The reply at `buf[*at..]`, moving `at` past it.
fn value(buf: &[u8], at: &mut usize, depth: usize) -> Result<Option<Value>, RedisError> {
    let start = *at;
    let Some(line) = line(buf, at)? else {
        return Ok(None);
    };
    let (&tag, rest) = line.split_first().ok_or_else(|| broken("an empty line"))?;
    Ok(Some(match tag {
        b'+' if rest == b"OK" => Value::Okay,
        // Redis cuts what it echoes of a command (an unknown command's arguments, say)
        // at 128 bytes, which can split a character: still this call's answer.
        b'+' => Value::SimpleString(String::from_utf8_lossy(rest).into_owned()),
        // Borrowed as is when it is UTF-8 (almost always): no copy.
        b'-' => redis::parse_redis_value(String::from_utf8_lossy(&buf[start..*at]).as_bytes())?,
        b':' => Value::Int(int(rest)?),
        b'$' => match length(rest)? {
            None => Value::Nil,
            Some(n) => {
                let end = at
                    .checked_add(n + 2)
                    .ok_or_else(|| broken("a bulk length"))?;
                if buf.len() < end {
                    return Ok(None);
                }
                if &buf[end - 2..end] != b"\r\n" {
                    return Err(broken("a bulk string not ended by CRLF"));
                }
                let bytes = buf[*at..end - 2].to_vec();
                *at = end;
                Value::BulkString(bytes)
            }
        },
        b'*' => match length(rest)? {
            None => Value::Nil,
            Some(n) => {
                if depth == MAX_DEPTH {
                    return Err(broken("arrays nested too deep"));
                }
                // Each element takes at least 4 bytes: a short reply cannot claim more.
                let mut items = Vec::with_capacity(n.min(buf.len().saturating_sub(*at) / 4));
                for _ in 0..n {
                    match value(buf, at, depth + 1)? {
                        Some(v) => items.push(v),
                        None => return Ok(None),
                    }
                }
                Value::Array(items)
            }
        },
        _ => return Err(broken("a reply of an unknown type")),
    }))
}

/// The line at `buf[*at..]` without its CRLF, moving `at` past it.
fn line<'b>(buf: &'b [u8], at: &mut usize) -> Result<Option<&'b [u8]>, RedisError> {
    let rest = &buf[*at..];
    let Some(cr) = memchr::memchr(b'\r', rest) else {
        return Ok(None);
    };
    match rest.get(cr + 1) {
        None => Ok(None),
        Some(b'\n') => {
            *at += cr + 2;
            Ok(Some(&rest[..cr]))
        }
        Some(_) => Err(broken("a line with a bare CR")),
    }
}

/// `digits` as `str::parse` reads an `i64` (a sign, then decimal digits), without
/// the UTF-8 check: every reply's length and integer goes through here.
fn int(digits: &[u8]) -> Result<i64, RedisError> {
    let (negative, digits) = match digits {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, digits),
    };
    let number = |n: i64, &d: &u8| {
        let d = i64::from(d.wrapping_sub(b'0')).min(10);
        let n = n.checked_mul(10)?;
        match d {
            10 => None,
            d if negative => n.checked_sub(d),
            d => n.checked_add(d),
        }
    };
    (!digits.is_empty())
        .then(|| digits.iter().try_fold(0, number))
        .flatten()
        .ok_or_else(|| broken("an integer reply that is not a number"))
}

/// A bulk or array length: `None` for -1 (nil).
fn length(digits: &[u8]) -> Result<Option<usize>, RedisError> {
    match int(digits)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_LEN)
            .map(Some)
            .ok_or_else(|| broken("a length out of range")),
    }
}

/// The stream is not RESP: the connection cannot be read any further.
fn broken(what: &'static str) -> RedisError {
    RedisError::from((
        ErrorKind::Parse,
        "the Redis connection sent what is not a RESP2 reply",
        what.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Integers read as `str::parse` reads them: random numbers, the edges, and
    /// random bytes that are mostly not numbers.
    #[test]
    fn integers_read_as_parse_reads_them() {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut cases: Vec<Vec<u8>> = [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX]
            .iter()
            .map(|n| n.to_string().into_bytes())
            .collect();
        cases.extend(
            [
                &b""[..],
                b"-",
                b"+",
                b"+7",
                b"-0",
                b"007",
                b"9223372036854775808",
                b"1 ",
            ]
            .map(<[u8]>::to_vec),
        );
        for _ in 0..20_000 {
            cases.push(match rng.u8(..3) {
                0 => rng.i64(..).to_string().into_bytes(),
                1 => (rng.i64(..) >> rng.u32(..64)).to_string().into_bytes(),
                _ => {
                    let alphabet = b"0123456789-+ x\xff";
                    (0..rng.usize(..22))
                        .map(|_| alphabet[rng.usize(..alphabet.len())])
                        .collect()
                }
            });
        }
        for case in cases {
            let want = std::str::from_utf8(&case)
                .ok()
                .and_then(|s| s.parse::<i64>().ok());
            assert_eq!(
                int(&case).ok(),
                want,
                "{:?}",
                String::from_utf8_lossy(&case)
            );
        }
    }

    /// A random reply and its encoding.
    fn random_reply(rng: &mut fastrand::Rng, depth: usize) -> (Value, Vec<u8>) {
        match rng.u8(..if depth > 3 { 5 } else { 6 }) {
            0 => (Value::Okay, b"+OK\r\n".to_vec()),
            1 => {
                let s: String = (0..rng.usize(..12)).map(|_| rng.alphanumeric()).collect();
                (
                    Value::SimpleString(s.clone()),
                    format!("+{s}\r\n").into_bytes(),
                )
            }
            2 => {
                let n = rng.i64(..);
                (Value::Int(n), format!(":{n}\r\n").into_bytes())
            }
            3 => (Value::Nil, b"$-1\r\n".to_vec()),
            4 => {
                // Any bytes, CR and LF among them.
                let b: Vec<u8> = (0..rng.usize(..40)).map(|_| rng.u8(..)).collect();
                let mut enc = format!("${}\r\n", b.len()).into_bytes();
                enc.extend_from_slice(&b);
                enc.extend_from_slice(b"\r\n");
                (Value::BulkString(b), enc)
            }
            _ => {
                let n = rng.usize(..5);
                let mut enc = format!("*{n}\r\n").into_bytes();
                let mut items = Vec::new();
                for _ in 0..n {
                    let (v, e) = random_reply(rng, depth + 1);
                    items.push(v);
                    enc.extend_from_slice(&e);
                }
                (Value::Array(items), enc)
            }
        }
    }

    #[test]
    fn random_replies_parse_whole_and_never_from_a_prefix() {
        for seed in 0..300 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let (want, enc) = random_reply(&mut rng, 0);
            let (got, used) = parse(&enc).unwrap().unwrap();
            assert_eq!(got, want, "seed {seed}");
            assert_eq!(used, enc.len(), "seed {seed}");
            for cut in 0..enc.len() {
                assert!(
                    parse(&enc[..cut]).unwrap().is_none(),
                    "seed {seed} cut {cut}"
                );
            }
        }
    }

    #[test]
    fn back_to_back_replies_are_read_one_at_a_time() {
        let mut rng = fastrand::Rng::with_seed(7);
        let (mut stream, mut want) = (Vec::new(), Vec::new());
        for _ in 0..50 {
            let (v, e) = random_reply(&mut rng, 0);
            want.push(v);
            stream.extend_from_slice(&e);
        }
        let mut at = 0;
        let mut got = Vec::new();
        while let Some((v, n)) = parse(&stream[at..]).unwrap() {
            got.push(v);
            at += n;
        }
        assert_eq!(at, stream.len());
        assert_eq!(got, want);
    }

    #[test]
    fn error_replies_keep_their_kind() {
        let (v, _) = parse(b"-NOSCRIPT No matching script.\r\n")
            .unwrap()
            .unwrap();
        let e = v.extract_error().unwrap_err();
        assert_eq!(
            e.kind(),
            ErrorKind::Server(redis::ServerErrorKind::NoScript)
        );
        let (v, _) = parse(b"*2\r\n:1\r\n-WRONGTYPE Operation\r\n")
            .unwrap()
            .unwrap();
        assert!(v.extract_error().is_err());
    }

    /// Redis cuts what it echoes of a command at 128 bytes, which can split a
    /// character: such an error is still an answer to its own call, not a broken
    /// stream that fails every call of the connection.
    #[test]
    fn an_error_or_status_reply_that_is_not_utf8_is_still_a_reply() {
        let stream = b"-ERR unknown command 'SET', with args beginning with: 'caf\xc3' \r\n+caf\xc3\r\n:1\r\n";
        let (v, n) = parse(stream).unwrap().unwrap();
        let e = v.extract_error().unwrap_err();
        assert!(e.to_string().contains("unknown command 'SET'"), "{e}");
        let (v, m) = parse(&stream[n..]).unwrap().unwrap();
        assert_eq!(v, Value::SimpleString("caf\u{fffd}".to_owned()));
        assert_eq!(parse(&stream[n + m..]).unwrap(), Some((Value::Int(1), 4)));
    }

    #[test]
    fn what_is_not_resp_is_refused() {
        for bad in [
            &b"?\r\n"[..],
            b"\r\n",
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"$-2\r\n",
            b"*99999999999\r\n",
            b"+a\rb\r\n",
            b"%1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
        let fine = "*1\r\n".repeat(MAX_DEPTH) + ":1\r\n";
        assert!(parse(fine.as_bytes()).unwrap().is_some());
    }
}
