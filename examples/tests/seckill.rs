//! The seckill scenario on real processes: a private redis-server, `seckill-server`
//! instances on their own ports sharing one database (a SQLite file; MariaDB and
//! RabbitMQ in `systems` and `mid_sale`), and the load generator.

#[path = "seckill/anomaly.rs"]
mod anomaly;
#[path = "seckill/lost_reply.rs"]
mod lost_reply;
#[path = "seckill/mid_sale.rs"]
mod mid_sale;
#[path = "seckill/redis_lost.rs"]
mod redis_lost;
#[path = "seckill/support.rs"]
mod support;
#[path = "seckill/systems.rs"]
mod systems;
#[path = "seckill/trim.rs"]
mod trim;

use std::time::{Duration, Instant};

use lock_examples::seckill::instances::Instance;
use lock_examples::seckill::load::{self, Http, LoadConfig};
use lock_examples::seckill::store::SqliteStore;
use support::{Dir, STREAM, drained, pending, persistent_redis, server_bin, wait_health};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flash_sale_on_two_instances_and_a_second_run_adds_no_duplicates() {
    let redis = persistent_redis();
    let dir = Dir::new("sale");
    let a = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &[])
        .await
        .unwrap();
    let b = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &[])
        .await
        .unwrap();
    let urls = [a.url.clone(), b.url.clone()];
    let config = LoadConfig {
        buyers: 300,
        stock: 50,
    };

    let v = load::run(config, &urls).await.unwrap();
    assert!(v.violations().is_empty(), "{v}");
    // What the benchmark counts a sale's instructions over.
    assert_eq!(v.requests, config.requests(), "{v}");
    assert_eq!((v.sold(), v.stock_left()), (Some(50), Some(0)), "{v}");
    assert_eq!(
        (v.accepted, v.rows, v.missing, v.oversold()),
        (50, 50, 0, 0),
        "{v}"
    );
    assert_eq!(
        (v.users_two_orders_201, v.users_two_orders_rows),
        (0, 0),
        "{v}"
    );
    // Every kind of refusal happened: the scenario exercised each piece.
    assert!(v.replays >= 30, "every same-key retry is a replay: {v}");
    assert!(v.already_ordered + v.lock_busy > 0, "{v}");
    assert!(v.sold_out > 0 && v.rate_limited > 0, "{v}");
    let store = SqliteStore::open(&dir.db()).unwrap();
    assert_eq!(store.count().await.unwrap(), 50);

    // Each instance exports what its orders did, in the Prometheus text format.
    let http = Http::new();
    let mut granted = 0;
    for url in &urls {
        let m = http.get(&format!("{url}/metrics")).await.unwrap();
        assert_eq!(m.status, 200);
        assert_eq!(m.content_type, "text/plain; version=0.0.4");
        let text = String::from_utf8_lossy(&m.body);
        granted += counter(
            &text,
            r#"lock_acquisitions_total{store="redis",primitive="lock",outcome="granted"}"#,
        );
        assert!(
            text.contains("# TYPE lock_acquisitions_total counter"),
            "{text}"
        );
        assert!(
            text.contains(r#"lock_hold_seconds_bucket{store="redis",primitive="lock",le="#),
            "{text}"
        );
    }
    // At least one per accepted order (the per-user lock); more for the refused ones.
    assert!(granted >= 50, "granted acquisitions: {granted}");

    // Once the sale is persisted, the workers trim what the group acknowledged: the
    // stream is empty again.
    wait_health(&http, &[&a.url, &b.url], "the stream to be trimmed", |hs| {
        hs.iter().all(|h| drained(h) && h["queue"]["length"] == 0)
    })
    .await;

    // Every order delivered again into the same database (as after a lost
    // acknowledgement: the same order once more on the stream): each is read and
    // written again, no row is added.
    let mut conn = redis.connection().await;
    for o in store.voucher_orders(v.voucher()).await.unwrap() {
        let _: String = redis::cmd("XADD")
            .arg(STREAM)
            .arg("*")
            .arg("order_id")
            .arg(&o.order_id)
            .arg("voucher_id")
            .arg(o.voucher_id)
            .arg("user_id")
            .arg(o.user_id)
            .arg("created_ms")
            .arg(0)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    wait_health(&http, &[&a.url, &b.url], "the re-delivery", |hs| {
        let dups: u64 = hs
            .iter()
            .filter_map(|h| h["worker"]["duplicates"].as_u64())
            .sum();
        dups >= 50 && hs.iter().all(drained)
    })
    .await;
    assert_eq!(store.count().await.unwrap(), 50);

    // A second sale against the same database: its own 50 rows, nothing else.
    let v2 = load::run(config, &urls).await.unwrap();
    assert!(v2.violations().is_empty(), "{v2}");
    assert_ne!(v2.voucher(), v.voucher());
    assert_eq!(store.count().await.unwrap(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_stream_loses_nothing() {
    let redis = persistent_redis();
    let dir = Dir::new("crash");
    let http = Http::new();
    // Instance A's process exits once its worker has read 3 entries, before
    // writing them: a crash with orders pending under its consumer.
    let mut a = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--crash-after-reads", "3"],
    )
    .await
    .unwrap();
    let voucher = http
        .create_voucher(&a.url, r#"{"stock": 20}"#.into())
        .await
        .unwrap();
    let mut accepted = Vec::new();
    for user in 1..=10 {
        match http.order(&a.url, voucher, user, "k").await {
            Ok(r) if r.status == 201 => {
                accepted.push(r.json()["order_id"].as_str().unwrap().to_owned())
            }
            Ok(r) => panic!("unexpected answer {}: {:?}", r.status, r.body),
            Err(_) => break, // A is gone
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.exited().is_none() {
        assert!(Instant::now() < deadline, "instance A did not crash");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        accepted.len() >= 2,
        "accepted before the crash: {accepted:?}"
    );
    let mut conn = redis.connection().await;
    assert!(
        pending(&mut conn).await >= 1,
        "the crash left entries pending"
    );

    // Instance B claims what A left behind.
    let b = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--claim-idle-ms", "300"],
    )
    .await
    .unwrap();
    wait_health(&http, &[&b.url], "B to claim and drain", |hs| {
        hs[0]["worker"]["claimed"].as_u64() >= Some(1) && drained(&hs[0])
    })
    .await;
    for id in &accepted {
        let r = http.get(&format!("{}/orders/{id}", b.url)).await.unwrap();
        assert_eq!(
            r.status, 200,
            "order {id} accepted with 201 is in the database"
        );
    }
    let sold = http
        .get(&format!("{}/vouchers/{voucher}", b.url))
        .await
        .unwrap()
        .json()["sold"]
        .as_i64();
    let store = SqliteStore::open(&dir.db()).unwrap();
    assert_eq!(
        Some(store.count().await.unwrap()),
        sold,
        "every unit taken is an order in the database"
    );
    assert_eq!(pending(&mut conn).await, 0);
}

/// The order limit counts the parsed buyer, so `7`, `07` and a `7` padded past 1 KB
/// (one buyer to the handler) share one quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_buyer_spelled_many_ways_shares_one_quota() {
    let redis = persistent_redis();
    let dir = Dir::new("spellings");
    let a = Instance::spawn(
        server_bin(),
        &redis.url(),
        &dir.db(),
        &["--user-rate", "1", "--user-burst", "1"],
    )
    .await
    .unwrap();
    let http = Http::new();
    let order_as = |user: String, key: &'static str| {
        let url = format!("{}/vouchers/1/orders", a.url);
        let http = &http;
        async move {
            let headers = [("x-user-id", user), ("idempotency-key", key.to_owned())];
            http.send(http::Method::POST, &url, &headers, None)
                .await
                .unwrap()
        }
    };
    let first = order_as("7".into(), "k1").await;
    assert_ne!(
        first.status, 429,
        "the buyer's first order is within the quota"
    );
    let padded = format!("{}7", "0".repeat(1100));
    for (user, key) in [
        ("07".to_owned(), "k2"),
        ("007".into(), "k3"),
        (padded, "k4"),
    ] {
        let r = order_as(user.clone(), key).await;
        assert_eq!(
            r.status, 429,
            "buyer 7 as {:.10}... got a fresh quota",
            user
        );
    }
}

/// One instance on `redis` and `dir`'s database whose per-user quota never refuses a
/// test's orders.
async fn generous_instance(redis: &lock_tests::RedisServer, dir: &Dir) -> Instance {
    let quota = ["--user-rate", "1000", "--user-burst", "1000"];
    Instance::spawn(server_bin(), &redis.url(), &dir.db(), &quota)
        .await
        .unwrap()
}

/// The time `d` from now, as a voucher's `begins_at` or `ends_at` (RFC 3339).
fn from_now(d: Duration) -> String {
    (time::OffsetDateTime::now_utc() + d)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// A 403 `not-active` before the sale begins carries `Retry-After` and is not stored,
/// so the buyer's retry with the same key after the start is served, not the 403
/// replayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_sale_is_not_replayed_after_it_begins() {
    let redis = persistent_redis();
    let dir = Dir::new("not-yet");
    let a = generous_instance(&redis, &dir).await;
    let http = Http::new();
    let begins = from_now(Duration::from_millis(1500));
    let voucher = http
        .create_voucher(
            &a.url,
            format!(r#"{{"stock": 5, "begins_at": "{begins}"}}"#),
        )
        .await
        .unwrap();
    let early = http.order(&a.url, voucher, 1, "same-key").await.unwrap();
    assert_eq!(early.status, 403, "{:?}", early.body);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = http.order(&a.url, voucher, 1, "same-key").await.unwrap();
        assert!(
            !r.replayed,
            "the early 403 was stored and replayed: {:?}",
            r.body
        );
        if r.status == 201 {
            break;
        }
        assert_eq!(r.status, 403, "{:?}", r.body);
        assert!(
            Instant::now() < deadline,
            "the sale never began for this key"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// After the sale has ended, a buyer who has an order (and maybe never got its 201)
/// still learns it by ordering again: 409 `already-ordered` naming the order, not the
/// 403 every other buyer gets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buyer_with_an_order_is_told_so_after_the_sale_ended() {
    let redis = persistent_redis();
    let dir = Dir::new("ended");
    let a = generous_instance(&redis, &dir).await;
    let http = Http::new();
    let ends = from_now(Duration::from_millis(1500));
    let voucher = http
        .create_voucher(&a.url, format!(r#"{{"stock": 1000, "ends_at": "{ends}"}}"#))
        .await
        .unwrap();
    let bought = http.order(&a.url, voucher, 1, "first").await.unwrap();
    assert_eq!(bought.status, 201, "{:?}", bought.body);
    let deadline = Instant::now() + Duration::from_secs(10);
    for n in 0.. {
        let late = http
            .order(&a.url, voucher, 100 + n, &format!("late-{n}"))
            .await
            .unwrap();
        if late.status == 403 {
            break;
        }
        assert_eq!(late.status, 201, "{:?}", late.body);
        assert!(Instant::now() < deadline, "the sale never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = http.order(&a.url, voucher, 1, "second").await.unwrap();
    let body = String::from_utf8_lossy(&again.body).into_owned();
    assert_eq!(again.status, 409, "{body}");
    assert!(body.contains("already-ordered"), "{body}");
    assert_eq!(again.location, bought.location, "{body}");
}

/// Every error the service sends is problem+json with a `type`, written byte for byte
/// by lock-tower's one writer: the service's own problems, unknown routes and wrong
/// methods. A body over the limit (413) is checked in process (`problem::tests`): over
/// TCP the server answers 413 while the client still writes, and the client's broken
/// pipe can come first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_problem_json_from_one_writer() {
    let redis = persistent_redis();
    let dir = Dir::new("problems");
    let a = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &[])
        .await
        .unwrap();
    let http = Http::new();
    let url = |path: &str| format!("{}{path}", a.url);
    let cases = [
        (http.get(&url("/vouchers/abc")).await, 400, "invalid-id"),
        (http.get(&url("/nope")).await, 404, "not-found"),
        (
            http.send(http::Method::DELETE, &url("/vouchers"), &[], None)
                .await,
            405,
            "method-not-allowed",
        ),
    ];
    for (reply, status, kind) in cases {
        let reply = reply.unwrap();
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!(reply.status, status, "{body}");
        assert_eq!(reply.content_type, "application/problem+json", "{body}");
        let detail = reply.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(!detail.is_empty(), "{body}");
        let code = http::StatusCode::from_u16(status).unwrap();
        let written = lock_tower::problem::Problem::new(code, kind, detail).to_json();
        assert_eq!(body, written);
    }
}

/// `--floor` (the benchmark's floor) serves the same routes but an order only takes its
/// stock: no idempotency key required, no lock, no limit; the script alone still sells
/// each unit once and one per user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_serves_orders_without_their_protections() {
    let redis = persistent_redis();
    let dir = Dir::new("floor");
    let floor = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &["--floor"])
        .await
        .unwrap();
    let http = Http::new();
    let voucher = http
        .create_voucher(&floor.url, r#"{"stock": 1}"#.into())
        .await
        .unwrap();
    let order = |user: i64| {
        let url = format!("{}/vouchers/{voucher}/orders", floor.url);
        let http = &http;
        async move {
            let headers = [("x-user-id", user.to_string())];
            http.send(http::Method::POST, &url, &headers, None)
                .await
                .unwrap()
        }
    };
    // No Idempotency-Key: the real service answers 400, the floor takes the stock.
    assert_eq!(order(1).await.status, 201);
    assert_eq!(
        order(1).await.status,
        409,
        "one per user, from the script alone"
    );
    assert_eq!(order(2).await.status, 410, "sold out");
}

/// An instance loads the stock script when it starts: the first orders of a sale on a
/// fresh Redis find it instead of each loading it after a NOSCRIPT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_script_is_loaded_before_the_first_order() {
    let redis = persistent_redis();
    let dir = Dir::new("preload");
    let take = redis::Script::new(include_str!("../lua/seckill_take.lua"));
    let mut conn = redis.connection().await;
    let mut loaded = async || {
        let exists: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(take.get_hash())
            .query_async(&mut conn)
            .await
            .unwrap();
        exists == [true]
    };
    assert!(!loaded().await, "a fresh Redis has no scripts");
    let _instance = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &[])
        .await
        .unwrap();
    assert!(loaded().await, "the instance started without loading it");
}

/// The value of the series `series` (name and labels, as rendered) in a Prometheus text
/// page; 0 if absent.
fn counter(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}
