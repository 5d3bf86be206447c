//! The order path: one order per user under `#[cache_lock]`, stock taken by one atomic
//! script that also queues the order.

use std::sync::LazyLock;
use std::time::Duration;

use lock_core::OrderId;
use lock_macros::cache_lock;
use redis::Value;

use super::app::App;
use super::clock::{format_ms, now_ms};
use super::keys;
use super::problem::{AppError, Problem};
use super::queue::ScriptSink;
use super::store::NewOrder;
use super::voucher;

/// `examples/lua/seckill_take.lua`: window, stock and buyer checks, decrement, buyer
/// record and stream append in one step.
static TAKE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/seckill_take.lua")));

/// Loads the stock script into Redis, so that the first orders of a sale find it:
/// otherwise every order of the first moment is answered NOSCRIPT and loads it itself.
/// (Redis forgets it on a restart or `SCRIPT FLUSH`; an order then loads it again.)
pub(crate) async fn load_stock_script(
    conn: &mut redis::aio::ConnectionManager,
) -> Result<(), redis::RedisError> {
    TAKE.load_async(conn).await.map(|_| ())
}

/// How long the claims of an order in flight (its idempotency key, the per-user lock)
/// outlive an instance that died holding them. Both are renewed every third of it while
/// the handler runs, so a slow order keeps them; a dead instance frees them this long
/// after its last renewal, and the buyer's retry is answered (its order, if it was taken).
pub(crate) const CLAIM_LEASE: Duration = Duration::from_secs(2);

/// What the stock script decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Take {
    /// Sold: the order is in the stream under `entry` (or in the outbox, `entry`
    /// `outbox`), taken at `created_ms` on the Redis clock.
    Taken {
        entry: String,
        stock_left: i64,
        created_ms: i64,
    },
    NoVoucher,
    NotStarted {
        begins_at_ms: i64,
    },
    Ended {
        ends_at_ms: i64,
    },
    /// The user already has an order for this voucher: `order_id`.
    AlreadyOrdered {
        order_id: i64,
    },
    SoldOut,
}

/// An accepted order.
#[derive(Debug)]
pub(crate) struct Placed {
    pub(crate) order_id: OrderId,
}

/// Places the order of `user_id` for `voucher_id`.
///
/// The lock makes a user's concurrent duplicates (double clicks, two tabs, a retry with
/// a fresh key) fail fast with 409 `lock-busy` instead of all running the script; the
/// script alone already guarantees one order per user and no oversell.
///
/// The lock has no fixed `expire`: the watchdog renews it (lease [`CLAIM_LEASE`], set on
/// the service's `LockClient`) while the body runs, and it frees itself that long after
/// an instance died holding it.
#[cache_lock(prefix = "seckill-order", key = (voucher_id, user_id), client = app.locks)]
pub(crate) async fn place_order(
    app: &App,
    voucher_id: i64,
    user_id: i64,
) -> Result<Placed, AppError> {
    take_order(app, voucher_id, user_id).await
}

/// The order itself, without the protections around it (lock, idempotency, rate
/// limit): an order id (from a reserved block, so almost never a Redis call), the
/// stock script (one round trip), and with RabbitMQ the publish and its confirm.
/// `--floor` serves this alone, as the floor of `scripts/bench seckill`.
pub(crate) async fn take_order(
    app: &App,
    voucher_id: i64,
    user_id: i64,
) -> Result<Placed, AppError> {
    let order_id = app.ids.next_id().await?;
    let mut conn = app.redis.clone();
    let (sink_key, sink) = match app.queue.script_sink() {
        ScriptSink::Stream => (keys::STREAM, "stream"),
        ScriptSink::Outbox => (keys::OUTBOX, "outbox"),
    };
    let reply: Value = TAKE
        .key(keys::voucher(voucher_id))
        .key(keys::buyers(voucher_id))
        .key(sink_key)
        .arg(voucher_id)
        .arg(user_id)
        .arg(order_id.get())
        .arg(sink)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| Problem::unavailable("the stock service", &e))?;
    let take = parse_take(&reply).ok_or_else(|| {
        Problem::unavailable(
            "the stock script",
            &format!("unexpected reply from seckill_take.lua: {reply:?}"),
        )
    })?;
    use axum::http::StatusCode;
    let refuse = |status, kind, detail: String| Err(Problem::new(status, kind, detail).into());
    match take {
        Take::Taken {
            entry,
            stock_left,
            created_ms,
        } => {
            tracing::debug!(%order_id, voucher_id, user_id, %entry, stock_left, "order taken");
            // Taken and in the outbox: if the publish fails, the outbox publishes it
            // later and the buyer's retry is told of it (409 naming the order).
            let id = i64::try_from(order_id.get()).map_err(|e| {
                Problem::unavailable("the order id", &format!("{order_id} is not an i64: {e}"))
            })?;
            let order = NewOrder {
                order_id: id,
                voucher_id,
                user_id,
                created_ms,
                stream_entry: entry,
            };
            app.queue
                .publish(&order)
                .await
                .map_err(|e| Problem::unavailable("the orders queue", &e))?;
            Ok(Placed { order_id })
        }
        Take::NoVoucher => Err(voucher::missing(app, voucher_id).await.into()),
        Take::NotStarted { begins_at_ms } => {
            // A refusal that passes: `Retry-After` keeps it out of the idempotency
            // record, so a retry with the same key after the start is served.
            let wait_ms = u64::try_from(begins_at_ms.saturating_sub(now_ms())).unwrap_or(0);
            let detail = format!(
                "the sale of voucher {voucher_id} begins at {}",
                format_ms(begins_at_ms)
            );
            Err(Problem::new(StatusCode::FORBIDDEN, "not-active", detail)
                .retry_after(wait_ms.div_ceil(1000))
                .into())
        }
        Take::Ended { ends_at_ms } => refuse(
            StatusCode::FORBIDDEN,
            "not-active",
            format!(
                "the sale of voucher {voucher_id} ended at {}",
                format_ms(ends_at_ms)
            ),
        ),
        // The existing order is named, so a buyer whose 201 was lost (the instance died
        // after the script, the reply vanished) learns it by ordering again.
        Take::AlreadyOrdered { order_id } => Err(Problem::new(
            StatusCode::CONFLICT,
            "already-ordered",
            format!(
                "user {user_id} already has order {order_id} for voucher {voucher_id}; one per user"
            ),
        )
        .existing(
            "order_id",
            order_id.to_string(),
            format!("/orders/{order_id}"),
        )
        .into()),
        Take::SoldOut => refuse(
            StatusCode::GONE,
            "sold-out",
            format!("voucher {voucher_id} is sold out"),
        ),
    }
}

/// Reads the script's reply (see the header of `examples/lua/seckill_take.lua`); `None`
/// for anything the script never returns.
pub(crate) fn parse_take(reply: &Value) -> Option<Take> {
    let Value::Array(items) = reply else {
        return None;
    };
    let text = |i: usize| match items.get(i)? {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    };
    let int = |i: usize| text(i)?.parse::<i64>().ok();
    Some(match text(0)?.as_str() {
        "ok" => Take::Taken {
            entry: text(1)?,
            stock_left: int(2)?,
            created_ms: int(3)?,
        },
        "no-voucher" => Take::NoVoucher,
        "not-started" => Take::NotStarted {
            begins_at_ms: int(1)?,
        },
        "ended" => Take::Ended {
            ends_at_ms: int(1)?,
        },
        "already-ordered" => Take::AlreadyOrdered { order_id: int(1)? },
        "sold-out" => Take::SoldOut,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn parses_every_reply_and_refuses_others() {
        let ok = Value::Array(vec![bulk("ok"), bulk("1-0"), Value::Int(4), Value::Int(7)]);
        assert_eq!(
            parse_take(&ok),
            Some(Take::Taken {
                entry: "1-0".into(),
                stock_left: 4,
                created_ms: 7,
            })
        );
        let ended = Value::Array(vec![bulk("ended"), bulk("1700000000000")]);
        assert_eq!(
            parse_take(&ended),
            Some(Take::Ended {
                ends_at_ms: 1_700_000_000_000
            })
        );
        assert_eq!(
            parse_take(&Value::Array(vec![bulk("sold-out")])),
            Some(Take::SoldOut)
        );
        assert_eq!(
            parse_take(&Value::Array(vec![bulk("already-ordered"), bulk("42")])),
            Some(Take::AlreadyOrdered { order_id: 42 })
        );
        for bad in [
            Value::Nil,
            Value::Int(1),
            Value::Array(vec![]),
            Value::Array(vec![bulk("ok")]),
            Value::Array(vec![bulk("ok"), bulk("1-0"), Value::Int(4)]),
            Value::Array(vec![bulk("already-ordered")]),
            Value::Array(vec![bulk("what")]),
        ] {
            assert_eq!(parse_take(&bad), None, "{bad:?}");
        }
    }
}
