//! Vouchers: creation (with input checks; the record and id in the orders database, the
//! live stock and buyers in Redis), the stock figures, and the refusal for a voucher Redis lost.

use std::sync::LazyLock;

use axum::http::StatusCode;
use redis::aio::ConnectionManager;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::app::App;
use super::keys;
use super::problem::Problem;

/// `examples/lua/seckill_voucher.lua`: the voucher hash, unless one exists under that id.
static CREATE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/seckill_voucher.lua")));

/// Largest stock of one voucher.
pub(crate) const MAX_STOCK: i64 = 100_000_000;

/// The body of `POST /vouchers`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewVoucher {
    stock: i64,
    begins_at: Option<String>,
    ends_at: Option<String>,
}

/// A checked [`NewVoucher`]: the window in Unix milliseconds.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct VoucherSpec {
    pub(crate) stock: i64,
    pub(crate) begins_at_ms: Option<i64>,
    pub(crate) ends_at_ms: Option<i64>,
}

/// `GET /vouchers/{id}`.
#[derive(Debug, Serialize)]
pub(crate) struct VoucherState {
    pub(crate) id: i64,
    pub(crate) stock_left: i64,
    pub(crate) sold: i64,
}

/// Parses and checks the body of `POST /vouchers`; every refusal is a 400 that says
/// what to send instead.
pub(crate) fn parse_new_voucher(body: &[u8]) -> Result<VoucherSpec, Problem> {
    let v: NewVoucher = serde_json::from_slice(body).map_err(|e| {
        Problem::bad_request(
            "invalid-voucher",
            format!(
                "expected a JSON object {{\"stock\": N, \"begins_at\": RFC 3339?, \
                 \"ends_at\": RFC 3339?}}: {e}"
            ),
        )
    })?;
    if !(1..=MAX_STOCK).contains(&v.stock) {
        return Err(Problem::bad_request(
            "invalid-voucher",
            format!("stock must be between 1 and {MAX_STOCK}, got {}", v.stock),
        ));
    }
    let begins_at_ms = v.begins_at.as_deref().map(rfc3339_ms).transpose()?;
    let ends_at_ms = v.ends_at.as_deref().map(rfc3339_ms).transpose()?;
    if let (Some(b), Some(e)) = (begins_at_ms, ends_at_ms)
        && b >= e
    {
        return Err(Problem::bad_request(
            "invalid-voucher",
            "begins_at must be before ends_at",
        ));
    }
    Ok(VoucherSpec {
        stock: v.stock,
        begins_at_ms,
        ends_at_ms,
    })
}

fn rfc3339_ms(s: &str) -> Result<i64, Problem> {
    let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|e| {
        Problem::bad_request(
            "invalid-voucher",
            format!("{s:?} is not an RFC 3339 time such as 2025-06-18T20:00:00Z: {e}"),
        )
    })?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| Problem::bad_request("invalid-voucher", format!("{s:?} is out of range")))
}

/// Creates a voucher: its record and id in the database first, whose ids never repeat,
/// so a Redis that lost its data cannot hand out an old voucher's id again; then its
/// stock in Redis. Returns its id.
pub(crate) async fn create(app: &App, spec: &VoucherSpec) -> Result<i64, Problem> {
    let id = app
        .store
        .create_voucher(spec.stock, spec.begins_at_ms, spec.ends_at_ms)
        .await
        .map_err(|e| Problem::unavailable("the orders database", &e))?;
    let bound = |ms: Option<i64>| ms.map(|m| m.to_string()).unwrap_or_default();
    let created: i64 = CREATE
        .key(keys::voucher(id))
        .arg(spec.stock)
        .arg(bound(spec.begins_at_ms))
        .arg(bound(spec.ends_at_ms))
        .invoke_async(&mut app.redis.clone())
        .await
        .map_err(|e| Problem::unavailable("Redis", &e))?;
    if created == 0 {
        tracing::error!(
            id,
            "voucher id new in the database but already in Redis; Redis left untouched"
        );
        return Err(Problem::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "voucher-id-conflict",
            format!(
                "voucher {id} is new in the database but Redis already holds a voucher {id}: \
                 --redis and --db belong to different deployments"
            ),
        ));
    }
    Ok(id)
}

/// The refusal for voucher `id` when Redis has no state for it: 404 if it was never
/// created; 503 `voucher-state-lost` if the database has it (Redis lost its stock and
/// buyers, e.g. restarted without persistence): it is not sold from an empty slate.
pub(crate) async fn missing(app: &App, id: i64) -> Problem {
    match app.store.has_voucher(id).await {
        Ok(false) => Problem::not_found(format!("there is no voucher {id}")),
        Ok(true) => {
            tracing::error!(
                id,
                "voucher in the database but not in Redis; not selling it"
            );
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "voucher-state-lost",
                format!(
                    "voucher {id} exists but its stock and buyers are gone from Redis; \
                     it is not sold until they are restored"
                ),
            )
        }
        Err(e) => Problem::unavailable("the orders database", &e),
    }
}

/// The stock figures of voucher `id`, `None` if there is no such voucher.
pub(crate) async fn state(
    conn: &mut ConnectionManager,
    id: i64,
) -> Result<Option<VoucherState>, redis::RedisError> {
    let (stock, sold): (Option<i64>, Option<i64>) = redis::cmd("HMGET")
        .arg(keys::voucher(id))
        .arg("stock")
        .arg("sold")
        .query_async(conn)
        .await?;
    Ok(match (stock, sold) {
        (Some(stock_left), Some(sold)) => Some(VoucherState {
            id,
            stock_left,
            sold,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_window_and_refuses_bad_input() {
        let ok = parse_new_voucher(
            br#"{"stock": 5, "begins_at": "2025-01-01T00:00:00Z", "ends_at": "2025-01-01T01:00:00+01:00"}"#,
        );
        assert!(ok.is_err(), "ends_at equal to begins_at is refused");
        let ok = parse_new_voucher(br#"{"stock": 5, "ends_at": "2025-01-01T00:00:01Z"}"#).unwrap();
        assert_eq!(ok.stock, 5);
        assert_eq!(ok.begins_at_ms, None);
        assert_eq!(ok.ends_at_ms, Some(1_735_689_601_000));
        for bad in [
            &br#"{"stock": 0}"#[..],
            br#"{"stock": -3}"#,
            br#"{"stock": "7"}"#,
            br#"{"stock": 5, "begins_at": "tomorrow"}"#,
            br#"{"stock": 5, "extra": 1}"#,
            b"not json",
        ] {
            assert!(
                parse_new_voucher(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
