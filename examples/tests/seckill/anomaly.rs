//! An accepted order the database cannot take (its voucher and user already hold
//! another order id) is an anomaly: counted in `/healthz` and logged, not dropped
//! silently.

use lock_examples::seckill::instances::Instance;
use lock_examples::seckill::load::Http;
use lock_examples::seckill::store::SqliteStore;

use super::support::{Dir, STREAM, drained, persistent_redis, server_bin, wait_health};

/// Counted apart from the harmless re-deliveries (`duplicates`), so it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflicting_order_is_counted_as_an_anomaly() {
    let redis = persistent_redis();
    let dir = Dir::new("anomaly");
    let http = Http::new();
    let a = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &[])
        .await
        .unwrap();
    let voucher = http
        .create_voucher(&a.url, r#"{"stock": 5}"#.into())
        .await
        .unwrap();
    let r = http.order(&a.url, voucher, 1, "k").await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    let order_id: i64 = r.json()["order_id"].as_str().unwrap().parse().unwrap();
    wait_health(&http, &[&a.url], "the order to be persisted", |hs| {
        hs[0]["worker"]["persisted"] == 1
    })
    .await;

    // The same voucher and user under another order id (as after Redis lost its buyers
    // and sold the user a second unit).
    let mut conn = redis.connection().await;
    let _: String = redis::cmd("XADD")
        .arg(STREAM)
        .arg("*")
        .arg("order_id")
        .arg(order_id + 1)
        .arg("voucher_id")
        .arg(voucher)
        .arg("user_id")
        .arg(1)
        .arg("created_ms")
        .arg(0)
        .query_async(&mut conn)
        .await
        .unwrap();
    wait_health(&http, &[&a.url], "the anomaly to be counted", |hs| {
        hs[0]["worker"]["anomalies"] == 1 && drained(&hs[0])
    })
    .await;
    let store = SqliteStore::open(&dir.db()).unwrap();
    let rows = store.voucher_orders(voucher).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].order_id, order_id.to_string());
}
