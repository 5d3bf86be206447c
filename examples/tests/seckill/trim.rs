//! The orders stream is trimmed of what the group acknowledged, never of an entry a
//! worker holds unwritten.

use std::time::{Duration, Instant};

use lock_examples::seckill::instances::Instance;
use lock_examples::seckill::load::Http;
use lock_examples::seckill::store::SqliteStore;
use redis::Value;

use super::support::{
    Dir, GROUP, STREAM, drained, pending, persistent_redis, server_bin, wait_health,
};

async fn xlen(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    redis::cmd("XLEN")
        .arg(STREAM)
        .query_async(conn)
        .await
        .unwrap()
}

/// The ids of the stream's entries, oldest first (`XRANGE`), or of the group's pending
/// entries (`XPENDING` extended form): the first element of each item.
async fn ids(conn: &mut redis::aio::MultiplexedConnection, cmd: &mut redis::Cmd) -> Vec<String> {
    let reply: Value = cmd.query_async(conn).await.unwrap();
    let Value::Array(items) = reply else {
        panic!("{reply:?}")
    };
    items
        .iter()
        .map(|item| match item {
            Value::Array(parts) => match parts.first() {
                Some(Value::BulkString(id)) => String::from_utf8(id.clone()).unwrap(),
                other => panic!("entry id: {other:?}"),
            },
            other => panic!("entry: {other:?}"),
        })
        .collect()
}

/// The stream holds the backlog, not the sale: acknowledged entries go, pending and
/// undelivered ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_entries_are_trimmed_and_pending_ones_kept() {
    let redis = persistent_redis();
    let dir = Dir::new("trim");
    let http = Http::new();
    // A persists two orders one at a time, then exits on reading the third: two
    // entries acknowledged, one pending under A.
    let mut a = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--crash-after-reads", "3"],
    )
    .await
    .unwrap();
    let voucher = http
        .create_voucher(&a.url, r#"{"stock": 10}"#.into())
        .await
        .unwrap();
    for user in 1..=2u64 {
        let r = http.order(&a.url, voucher, user as i64, "k").await.unwrap();
        assert_eq!(r.status, 201, "{:?}", r.body);
        wait_health(&http, &[&a.url], "A to persist the order", |hs| {
            hs[0]["worker"]["persisted"].as_u64() == Some(user)
        })
        .await;
    }
    // The answer may or may not get out before A exits: the unit is taken either way.
    let _ = http.order(&a.url, voucher, 3, "k").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.exited().is_none() {
        assert!(Instant::now() < deadline, "instance A did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut conn = redis.connection().await;
    let mut xpending = redis::cmd("XPENDING");
    xpending.arg(STREAM).arg(GROUP).arg("-").arg("+").arg(10);
    let held = ids(&mut conn, &mut xpending).await;
    assert_eq!(held.len(), 1, "A left one entry pending: {held:?}");

    // B (which will not claim A's entry for ten minutes) trims the acknowledged
    // entries around it, and only those.
    let _b = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--claim-idle-ms", "600000"],
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while xlen(&mut conn).await != 1 {
        assert!(
            Instant::now() < deadline,
            "XLEN {}, want 1: the two acknowledged entries trimmed, the pending one kept",
            xlen(&mut conn).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut xrange = redis::cmd("XRANGE");
    xrange.arg(STREAM).arg("-").arg("+");
    assert_eq!(ids(&mut conn, &mut xrange).await, held);
    assert_eq!(pending(&mut conn).await, 1);

    // C claims A's entry and writes it; then the stream is empty and every unit taken
    // is a row.
    let c = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--claim-idle-ms", "300"],
    )
    .await
    .unwrap();
    wait_health(&http, &[&c.url], "C to claim, persist and trim", |hs| {
        hs[0]["worker"]["claimed"].as_u64() >= Some(1)
            && drained(&hs[0])
            && hs[0]["queue"]["length"] == 0
    })
    .await;
    let store = SqliteStore::open(&dir.db()).unwrap();
    let rows: Vec<i64> = store
        .voucher_orders(voucher)
        .await
        .unwrap()
        .iter()
        .map(|o| o.user_id)
        .collect();
    assert_eq!(rows, [1, 2, 3]);
}
