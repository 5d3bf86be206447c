//! The sale on each database under the Redis Stream, on real servers: SQLite, and
//! MariaDB as the MySQL target. Each run ends with the same checks: the stock ends at
//! zero, nobody has two orders, every order a buyer was told of (its 201, or the 409
//! naming it when a retry met an order taken before a crash) is a row, and every row is
//! an order its buyer was told of.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lock_examples::seckill::instances::Instance;
use lock_examples::seckill::load::{self, Http, LoadConfig};
use lock_examples::seckill::store::{self, MySqlStore, NewOrder, Storage};
use lock_tests::{MariaDbServer, RedisServer};

use super::support::{Dir, drained, persistent_redis, server_bin, wait_health};

/// Every commit on disk before it returns, as the MySQL store requires.
/// Between one buyer's start and the next: the sale lasts a moment, so a fault lands
/// in it, with many orders in flight.
const PACE_MS: u64 = 1;
const DURABLE: &[&str] = &["--innodb-flush-log-at-trx-commit=1"];
/// A quota no buyer's retries reach, and a quick takeover of a dead worker's entries.
const FLAGS: &[&str] = &[
    "--user-rate",
    "1000",
    "--user-burst",
    "1000",
    "--claim-idle-ms",
    "500",
];

/// The database under test.
enum Db {
    Sqlite(Dir),
    MySql(MariaDbServer),
}

impl Db {
    fn sqlite(name: &str) -> Self {
        Db::Sqlite(Dir::new(name))
    }

    fn mysql() -> Self {
        Db::MySql(MariaDbServer::start_with_args(DURABLE))
    }

    /// What `--db` says.
    fn arg(&self) -> String {
        match self {
            Db::Sqlite(dir) => dir.db().display().to_string(),
            Db::MySql(server) => server.url(),
        }
    }

    async fn store(&self) -> Arc<dyn Storage> {
        store::open(&self.arg()).await.unwrap()
    }
}

async fn instances(redis: &RedisServer, db: &Db, flags: &[&str]) -> (Instance, Instance) {
    let url = redis.url();
    let a = Instance::spawn(server_bin(), &url, db.arg(), flags);
    let b = Instance::spawn(server_bin(), &url, db.arg(), flags);
    let (a, b) = tokio::join!(a, b);
    (a.unwrap(), b.unwrap())
}

fn order(order_id: i64, user_id: i64) -> NewOrder {
    NewOrder {
        order_id,
        voucher_id: 1,
        user_id,
        created_ms: 1_735_689_601_000,
        stream_entry: format!("{order_id}-0"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_inserts_are_idempotent_and_one_per_user() {
    let server = MariaDbServer::start_with_args(DURABLE);
    let store = MySqlStore::connect(&server.url()).await.unwrap();
    let first = store
        .insert_batch(vec![order(10, 1), order(11, 2)])
        .await
        .unwrap();
    assert_eq!((first.new, first.already_there), (2, 0));
    // The same orders again (a re-delivery), and another order for user 1.
    let again = store
        .insert_batch(vec![order(10, 1), order(11, 2), order(12, 1), order(13, 3)])
        .await
        .unwrap();
    assert_eq!((again.new, again.already_there), (1, 2));
    assert_eq!(again.conflicting, [(order(12, 1), Some(10))]);
    // Order id 11 on another user's sale.
    let reused = store.insert_batch(vec![order(11, 4)]).await.unwrap();
    assert_eq!(reused.conflicting, [(order(11, 4), None)]);
    assert_eq!(store.count().await.unwrap(), 3);
    let ids: Vec<_> = store
        .voucher_orders(1)
        .await
        .unwrap()
        .into_iter()
        .map(|o| o.order_id)
        .collect();
    assert_eq!(ids, ["10", "11", "13"]);
    assert_eq!(store.order(12).await.unwrap(), None);
    assert_eq!(
        store.order(13).await.unwrap().unwrap().created_at,
        "2025-01-01T00:00:01Z"
    );
    let (v1, v2) = (
        store.create_voucher(5, None, None).await.unwrap(),
        store.create_voucher(5, Some(1), Some(2)).await.unwrap(),
    );
    assert!(v2 > v1 && store.has_voucher(v2).await.unwrap());
    assert!(!store.has_voucher(v2 + 1).await.unwrap());
}

/// With `innodb_flush_log_at_trx_commit=0` a crash of the server loses the last
/// second of commits, which the worker has acknowledged: refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_that_can_lose_commits_is_refused() {
    let lazy = MariaDbServer::start(); // the harness default: flush once a second
    let why = MySqlStore::connect(&lazy.url()).await.unwrap_err();
    assert!(
        why.to_string().contains("innodb_flush_log_at_trx_commit=0"),
        "{why}"
    );
}

/// The demo's burst: 2000 buyers at once for 100 units on two instances.
async fn burst(db: Db) {
    let redis = persistent_redis();
    let (a, b) = instances(&redis, &db, &[]).await;
    let config = LoadConfig {
        buyers: 2000,
        stock: 100,
    };
    let v = load::run(config, &[a.url.clone(), b.url.clone()])
        .await
        .unwrap();
    assert!(v.violations().is_empty(), "{v}");
    assert_eq!(
        (v.accepted, v.rows, v.stock_left()),
        (100, 100, Some(0)),
        "{v}"
    );
    assert_eq!(db.store().await.count().await.unwrap(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_2000_buyers_on_sqlite() {
    burst(Db::sqlite("burst")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_2000_buyers_on_mysql() {
    burst(Db::mysql()).await;
}

/// What the sale told buyers: for each, the order id of its 201 or of the 409 that
/// named its order, if any.
type Told = HashMap<i64, String>;

/// `buyers` buyers, paced [`PACE_MS`] apart, each ordering until it gets an answer
/// that settles it (201, 409 naming its order, 410), on instance `user % 2` first and
/// the other after a failure, with the same key throughout (a client retrying after a
/// timeout). `sold` counts the 201s as they come.
async fn buy_through_faults(
    urls: [String; 2],
    voucher: i64,
    buyers: i64,
    sold: Arc<AtomicU64>,
) -> Told {
    let http = Http::new();
    let mut tasks = Vec::new();
    for user in 1..=buyers {
        let (http, urls, sold) = (http.clone(), urls.clone(), sold.clone());
        tasks.push(tokio::spawn(async move {
            // Pacing, so the faults land mid-sale.
            tokio::time::sleep(Duration::from_millis(user as u64 * PACE_MS)).await;
            let deadline = Instant::now() + Duration::from_secs(60);
            let key = format!("buyer-{user}");
            let mut attempt = 0usize;
            loop {
                assert!(Instant::now() < deadline, "buyer {user} never settled");
                let url = &urls[(user as usize + attempt) % 2];
                attempt += 1;
                let Ok(r) = http.order(url, voucher, user, &key).await else {
                    continue; // that instance is gone: the other one next
                };
                let named = || r.json()["order_id"].as_str().map(str::to_owned);
                match (r.status, r.problem_type().as_deref()) {
                    (201, _) => {
                        sold.fetch_add(1, Ordering::Relaxed);
                        return Some(named().unwrap());
                    }
                    (409, Some("already-ordered")) => return Some(named().unwrap()),
                    (410, _) => return None,
                    // A dead instance's claims (about 2 s), a store restarting: again.
                    (409 | 429 | 503, _) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    (status, _) => panic!("buyer {user}: {status} {:?}", r.body),
                }
            }
        }));
    }
    let mut told = Told::new();
    for (user, task) in (1..).zip(tasks) {
        if let Some(id) = task.await.unwrap() {
            told.insert(user, id);
        }
    }
    told
}

/// Waits until `sold` reaches `n`.
async fn until_sold(sold: &AtomicU64, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while sold.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "the sale stalled before {n} units"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The checks of every faulty sale; `live` are the instances still running.
async fn assert_sale_whole(db: &Db, live: &[&str], voucher: i64, stock: i64, told: &Told) {
    let http = Http::new();
    wait_health(&http, live, "the queue to drain", |hs| {
        hs.iter().all(drained)
    })
    .await;
    let state = http
        .get(&format!("{}/vouchers/{voucher}", live[0]))
        .await
        .unwrap()
        .json();
    assert_eq!(state["stock_left"], 0, "{state}");
    assert_eq!(state["sold"], stock, "{state}");
    let rows = db.store().await.voucher_orders(voucher).await.unwrap();
    let users: HashSet<i64> = rows.iter().map(|o| o.user_id).collect();
    assert_eq!(users.len(), rows.len(), "a user has two rows: {rows:?}");
    assert_eq!(rows.len() as i64, stock, "every unit sold is a row");
    let row_of: HashMap<i64, &str> = rows
        .iter()
        .map(|o| (o.user_id, o.order_id.as_str()))
        .collect();
    for (user, id) in told {
        assert_eq!(
            row_of.get(user),
            Some(&id.as_str()),
            "user {user} told of {id}"
        );
    }
    for (user, id) in &row_of {
        assert_eq!(
            told.get(user).map(String::as_str),
            Some(*id),
            "row {id} never told"
        );
    }
}

/// Instance A gets SIGKILL early in the sale: its buyers retry on B, which answers them
/// once A's claims expire, and B's worker claims what A's left pending (when the kill
/// found any: `a_worker_killed_mid_stream_loses_nothing` makes sure of that case).
async fn instance_killed_mid_sale(db: Db) {
    let redis = persistent_redis();
    let (mut a, b) = instances(&redis, &db, FLAGS).await;
    let http = Http::new();
    let stock = 60;
    let voucher = http
        .create_voucher(&b.url, format!(r#"{{"stock": {stock}}}"#))
        .await
        .unwrap();
    let sold = Arc::new(AtomicU64::new(0));
    let sale = tokio::spawn(buy_through_faults(
        [a.url.clone(), b.url.clone()],
        voucher,
        300,
        sold.clone(),
    ));
    until_sold(&sold, 5).await;
    a.kill().await;
    let at_kill = sold.load(Ordering::Relaxed);
    let told = sale.await.unwrap();
    assert!(at_kill < stock as u64, "the kill came after the sale");
    assert_sale_whole(&db, &[&b.url], voucher, stock, &told).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_sale_on_sqlite() {
    instance_killed_mid_sale(Db::sqlite("killed")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_sale_on_mysql() {
    instance_killed_mid_sale(Db::mysql()).await;
}

/// MariaDB gets SIGKILL once a third of the stock is sold and comes back: the sale
/// goes on in Redis meanwhile, the workers write what waited once it is back, and
/// nothing committed before the kill is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_restarted_mid_sale() {
    let redis = persistent_redis();
    let db = Db::mysql();
    let (a, b) = instances(&redis, &db, FLAGS).await;
    let http = Http::new();
    let stock = 60;
    let voucher = http
        .create_voucher(&a.url, format!(r#"{{"stock": {stock}}}"#))
        .await
        .unwrap();
    let sold = Arc::new(AtomicU64::new(0));
    let sale = tokio::spawn(buy_through_faults(
        [a.url.clone(), b.url.clone()],
        voucher,
        300,
        sold.clone(),
    ));
    until_sold(&sold, stock as u64 / 3).await;
    let at_kill = sold.load(Ordering::Relaxed);
    assert!(at_kill < stock as u64, "the restart came after the sale");
    let Db::MySql(mut server) = db else {
        unreachable!()
    };
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let told = sale.await.unwrap();
    assert_sale_whole(&Db::MySql(server), &[&a.url, &b.url], voucher, stock, &told).await;
}
