//! Reading stream replies (`XREADGROUP`, `XAUTOCLAIM`, `XINFO`) without trusting their
//! shape: RESP2 arrays and RESP3 maps both work, anything else is `None`, never a panic.

use redis::Value;

use crate::seckill::store::NewOrder;

/// One stream entry: its id and, if well formed, the order it carries.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) id: String,
    pub(crate) order: Option<NewOrder>,
}

pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Key/value pairs of a RESP2 flat array or a RESP3 map.
pub(crate) fn pairs(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .map(|kv| match kv {
                [k, v] => Some((text(k)?, v)),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items.iter().map(|(k, v)| Some((text(k)?, v))).collect(),
        _ => None,
    }
}

/// `[id, [field, value, ...]]`.
fn entry(v: &Value) -> Option<Entry> {
    let Value::Array(parts) = v else {
        return None;
    };
    let id = text(parts.first()?)?;
    let order = parts.get(1).and_then(pairs).and_then(|fields| {
        let get = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .and_then(|(_, v)| text(v))
        };
        let int = |name: &str| get(name)?.parse::<i64>().ok();
        Some(NewOrder {
            order_id: int("order_id")?,
            voucher_id: int("voucher_id")?,
            user_id: int("user_id")?,
            created_ms: int("created_ms")?,
            stream_entry: id.clone(),
        })
    });
    Some(Entry { id, order })
}

fn entries(v: &Value) -> Option<Vec<Entry>> {
    match v {
        Value::Array(items) => items.iter().map(entry).collect(),
        Value::Nil => Some(Vec::new()),
        _ => None,
    }
}

/// The entries of an `XREADGROUP` reply on one stream (`Nil` on timeout: none).
pub(crate) fn read_group(v: &Value) -> Option<Vec<Entry>> {
    match v {
        Value::Nil => Some(Vec::new()),
        Value::Array(streams) => match streams.first() {
            None => Some(Vec::new()),
            Some(Value::Array(s)) => entries(s.get(1)?),
            Some(_) => None,
        },
        Value::Map(streams) => match streams.first() {
            None => Some(Vec::new()),
            Some((_, e)) => entries(e),
        },
        _ => None,
    }
}

/// The next cursor and the claimed entries of an `XAUTOCLAIM` reply.
pub(crate) fn autoclaim(v: &Value) -> Option<(String, Vec<Entry>)> {
    let Value::Array(parts) = v else {
        return None;
    };
    Some((text(parts.first()?)?, entries(parts.get(1)?)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn order_entry(id: &str, order: &str) -> Value {
        Value::Array(vec![
            b(id),
            Value::Array(vec![
                b("order_id"),
                b(order),
                b("voucher_id"),
                b("3"),
                b("user_id"),
                b("9"),
                b("created_ms"),
                b("1000"),
            ]),
        ])
    }

    #[test]
    fn reads_entries_and_flags_malformed_ones() {
        let reply = Value::Array(vec![Value::Array(vec![
            b("orders"),
            Value::Array(vec![
                order_entry("1-0", "77"),
                order_entry("2-0", "not a number"),
            ]),
        ])]);
        let got = read_group(&reply).unwrap();
        assert_eq!(got.len(), 2);
        let first = got[0].order.as_ref().unwrap();
        assert_eq!(
            (
                first.order_id,
                first.voucher_id,
                first.user_id,
                first.created_ms
            ),
            (77, 3, 9, 1000)
        );
        assert_eq!(first.stream_entry, "1-0");
        assert_eq!(got[1].id, "2-0");
        assert!(got[1].order.is_none());
        assert!(read_group(&Value::Nil).unwrap().is_empty());
        assert!(read_group(&Value::Int(3)).is_none());
    }

    #[test]
    fn reads_autoclaim() {
        let reply = Value::Array(vec![
            b("0-0"),
            Value::Array(vec![order_entry("5-1", "8")]),
            Value::Array(vec![]),
        ]);
        let (cursor, got) = autoclaim(&reply).unwrap();
        assert_eq!(cursor, "0-0");
        assert_eq!(got[0].order.as_ref().unwrap().order_id, 8);
        assert!(autoclaim(&Value::Nil).is_none());
    }
}
