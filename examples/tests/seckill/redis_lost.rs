//! Redis without persistence: the server refuses it unless told otherwise, and when it
//! restarts empty, vouchers and their ids live on in SQLite, so no id is handed out
//! twice and a voucher whose Redis state is gone is not sold again from an empty slate.

use std::time::{Duration, Instant};

use lock_examples::seckill::instances::{BoxError, Instance};
use lock_examples::seckill::load::{Http, Reply};
use lock_examples::seckill::store::SqliteStore;
use lock_tests::RedisServer;

use super::support::{Dir, drained, persistent_redis, server_bin, wait_health};

/// Sends `request` until the service has reconnected to the restarted Redis (no more
/// 503 `service-unavailable`), and returns that answer.
async fn once_reconnected<F: Future<Output = Result<Reply, BoxError>>>(
    request: impl Fn() -> F,
) -> Reply {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = request().await.unwrap();
        if r.problem_type().as_deref() != Some("service-unavailable") {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "Redis never came back: {:?}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Voucher ids come from the database, so a Redis restarted empty cannot hand out an
/// id again and sell it to users who already have an order for the old voucher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_lost_its_data_reuses_no_voucher_id_and_resells_nothing() {
    let mut redis = RedisServer::start();
    let dir = Dir::new("redis-lost");
    let http = Http::new();
    let flags = [
        "--user-rate",
        "1000",
        "--user-burst",
        "1000",
        "--allow-volatile-redis",
    ];
    let a = Instance::spawn(server_bin(), &redis.url(), &dir.db(), &flags)
        .await
        .unwrap();
    let vouchers = format!("{}/vouchers", a.url);
    let first = http
        .create_voucher(&a.url, r#"{"stock": 5}"#.into())
        .await
        .unwrap();
    let r = http.order(&a.url, first, 1, "k1").await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    wait_health(&http, &[&a.url], "the order to be persisted", |hs| {
        hs[0]["worker"]["persisted"] == 1 && drained(&hs[0])
    })
    .await;

    redis.restart(); // no persistence: stock, buyers, stream and counters are gone

    // The old voucher is not sold from an empty slate.
    let again = once_reconnected(|| http.order(&a.url, first, 1, "k2")).await;
    assert_eq!(
        (again.status, again.problem_type().as_deref()),
        (503, Some("voucher-state-lost")),
        "{:?}",
        again.body
    );
    let state = http.get(&format!("{vouchers}/{first}")).await.unwrap();
    assert_eq!(state.problem_type().as_deref(), Some("voucher-state-lost"));

    // A new voucher gets a new id.
    let created = once_reconnected(|| http.post_json(&vouchers, r#"{"stock": 5}"#.into())).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let second = created.json()["id"].as_i64().unwrap();
    assert!(second > first, "voucher id {second} handed out again");

    let r = http.order(&a.url, second, 1, "k3").await.unwrap();
    assert_eq!(r.status, 201, "{:?}", r.body);
    wait_health(&http, &[&a.url], "the second order to be persisted", |hs| {
        hs[0]["worker"]["persisted"] == 2 && drained(&hs[0])
    })
    .await;
    let store = SqliteStore::open(&dir.db()).unwrap();
    for voucher in [first, second] {
        let rows = store.voucher_orders(voucher).await.unwrap();
        assert_eq!(rows.len(), 1, "voucher {voucher}: {rows:?}");
    }
}

/// Redis is the only record of an order until the worker writes it, so a Redis that
/// keeps nothing across a restart is refused unless asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_a_redis_that_does_not_persist() {
    let volatile = RedisServer::start(); // --appendonly no
    let dir = Dir::new("volatile");
    let refused = Instance::spawn(server_bin(), &volatile.url(), &dir.db(), &[]).await;
    let why = refused
        .expect_err("started on a Redis without AOF")
        .to_string();
    assert!(why.contains("exit status"), "{why}");
    Instance::spawn(
        server_bin(),
        &volatile.url(),
        &dir.db(),
        &["--allow-volatile-redis"],
    )
    .await
    .expect("--allow-volatile-redis starts it anyway");
    let persistent = persistent_redis();
    Instance::spawn(server_bin(), &persistent.url(), &dir.db(), &[])
        .await
        .expect("AOF with appendfsync always is accepted");
}
