//! A buyer whose unit was taken but whose 201 never arrived (the instance died after
//! the stock script): the retry is answered within about two seconds, with the order.

use std::time::{Duration, Instant};

use lock_examples::seckill::instances::Instance;
use lock_examples::seckill::load::{Http, Reply};
use redis::Value;

use super::support::{Dir, STREAM, persistent_redis, server_bin};

/// The `order_id` fields of every entry in the orders stream.
async fn queued_order_ids(conn: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let reply: Value = redis::cmd("XRANGE")
        .arg(STREAM)
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        other => panic!("XRANGE field: {other:?}"),
    };
    let Value::Array(entries) = reply else {
        panic!("XRANGE: {reply:?}")
    };
    entries
        .iter()
        .map(|e| match e {
            Value::Array(parts) => match parts.get(1) {
                Some(Value::Array(fields)) => fields
                    .chunks(2)
                    .find(|kv| text(&kv[0]) == "order_id")
                    .map(|kv| text(&kv[1]))
                    .unwrap(),
                other => panic!("XRANGE entry fields: {other:?}"),
            },
            other => panic!("XRANGE entry: {other:?}"),
        })
        .collect()
}

/// The answer names the user's existing order: 409 `already-ordered` with its id in
/// the body and its `Location`.
fn assert_names_order(r: &Reply, order_id: &str) {
    assert_eq!(
        (r.status, r.problem_type().as_deref()),
        (409, Some("already-ordered")),
        "{:?}",
        r.body
    );
    assert_eq!(r.json()["order_id"], order_id, "{:?}", r.body);
    assert_eq!(
        r.location.as_deref(),
        Some(format!("/orders/{order_id}").as_str())
    );
}

/// The retry is answered once the dead instance's claims expire (about 2 s), and the
/// answer names the order, so the buyer learns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_whose_201_was_lost_learns_the_order_by_ordering_again() {
    let redis = persistent_redis();
    let dir = Dir::new("lost-reply");
    let http = Http::new();
    // A exits right after the script took its first unit, before answering.
    let mut a = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--crash-after-takes", "1"],
    )
    .await
    .unwrap();
    // B: a quota the retries below stay within, and a quick claim of A's pending entry.
    let flags = [
        "--user-rate",
        "1000",
        "--user-burst",
        "1000",
        "--claim-idle-ms",
        "300",
    ];
    let b = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &flags)
        .await
        .unwrap();
    let voucher = http
        .create_voucher(&b.url, r#"{"stock": 5}"#.into())
        .await
        .unwrap();

    let lost = http.order(&a.url, voucher, 1, "key-1").await;
    assert!(lost.is_err(), "A answered after all: {lost:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.exited().is_none() {
        assert!(Instant::now() < deadline, "instance A did not exit");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let died = Instant::now();
    let mut conn = redis.connection().await;
    let queued = queued_order_ids(&mut conn).await;
    assert_eq!(queued.len(), 1, "the unit was taken and queued: {queued:?}");
    let taken = &queued[0];

    // The buyer retries with the same key on B. A's claims (the key in flight, the
    // per-user lock) free within about 2 s of its death.
    let answer = loop {
        let r = http.order(&b.url, voucher, 1, "key-1").await.unwrap();
        match (r.status, r.problem_type().as_deref()) {
            (409, Some("idempotency-key-in-use" | "lock-busy")) => {
                assert!(
                    died.elapsed() < Duration::from_secs(4),
                    "A's claims outlived it by {:?}: {:?}",
                    died.elapsed(),
                    r.body
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => break r,
        }
    };
    assert_names_order(&answer, taken);
    // Again with the same key (the answer replayed), and with a new key: the same order.
    let replayed = http.order(&b.url, voucher, 1, "key-1").await.unwrap();
    assert!(replayed.replayed);
    assert_names_order(&replayed, taken);
    assert_names_order(
        &http.order(&b.url, voucher, 1, "key-2").await.unwrap(),
        taken,
    );

    // The Location leads to the order once a worker has persisted it.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = http
            .get(&format!("{}/orders/{taken}", b.url))
            .await
            .unwrap();
        if r.status == 200 {
            assert_eq!(r.json()["user_id"], 1, "{:?}", r.body);
            break;
        }
        assert_eq!(r.status, 404, "{:?}", r.body);
        assert!(Instant::now() < deadline, "order {taken} never persisted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
