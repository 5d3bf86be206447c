//! The sale on each combination of database and queue, on real servers: SQLite and
//! MariaDB (the MySQL target) under the Redis Stream, and MariaDB under RabbitMQ. What
//! each combination runs on, the stores' contract on MariaDB, and the demo's burst on
//! each; `mid_sale` kills or restarts a process during a sale.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_examples::seckill::instances::Instance;
use lock_examples::seckill::load::{self, Http, LoadConfig};
use lock_examples::seckill::store::{self, Inserted, MySqlStore, NewOrder, SqliteStore, Storage};
use lock_tests::{MariaDbServer, RabbitMqServer, RedisServer};

use super::support::{Dir, one_sale_at_a_time, persistent_redis, server_bin};

/// Every commit on disk before it returns, as the MySQL store requires.
const DURABLE: &[&str] = &["--innodb-flush-log-at-trx-commit=1"];

/// The database under test.
pub(crate) enum Db {
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

    pub(crate) async fn store(&self) -> Arc<dyn Storage> {
        store::open(&self.arg()).await.unwrap()
    }
}

/// The queue under test.
pub(crate) enum Queue {
    Stream,
    Rabbit(RabbitMqServer),
}

impl Queue {
    /// What `--queue` says.
    fn arg(&self) -> String {
        match self {
            Queue::Stream => "stream".into(),
            Queue::Rabbit(server) => server.url(),
        }
    }
}

/// One combination's servers: Redis (persistent), the database and the queue.
pub(crate) struct System {
    pub(crate) redis: RedisServer,
    pub(crate) db: Db,
    pub(crate) queue: Queue,
}

impl System {
    pub(crate) fn sqlite_stream(name: &str) -> Self {
        Self::new(Db::sqlite(name), Queue::Stream)
    }

    pub(crate) fn mysql_stream() -> Self {
        Self::new(Db::mysql(), Queue::Stream)
    }

    pub(crate) fn mysql_rabbit() -> Self {
        let (db, rabbit) = std::thread::scope(|s| {
            // Both take seconds to boot: side by side.
            let rabbit = s.spawn(RabbitMqServer::start);
            (Db::mysql(), rabbit.join().unwrap())
        });
        Self::new(db, Queue::Rabbit(rabbit))
    }

    fn new(db: Db, queue: Queue) -> Self {
        Self {
            redis: persistent_redis(),
            db,
            queue,
        }
    }

    /// An instance on these servers, with `flags`.
    pub(crate) async fn instance(&self, flags: &[&str]) -> Instance {
        let queue = self.queue.arg();
        let mut args = vec!["--queue", queue.as_str()];
        args.extend_from_slice(flags);
        Instance::spawn(server_bin(), &self.redis.url(), self.db.arg(), &args)
            .await
            .unwrap()
    }

    /// Two instances on these servers, with `flags`.
    pub(crate) async fn instances(&self, flags: &[&str]) -> (Instance, Instance) {
        tokio::join!(self.instance(flags), self.instance(flags))
    }
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

/// What every `Storage` promises the worker: a re-delivered order is found, not
/// written twice; a second order of one user on one voucher is an anomaly; voucher ids
/// only grow.
async fn inserts_are_idempotent_and_one_per_user(store: &dyn Storage) {
    let first = store
        .insert_batch(vec![order(10, 1), order(11, 2)])
        .await
        .unwrap();
    assert_eq!(
        first,
        Inserted {
            new: 2,
            ..Inserted::default()
        }
    );
    // The same orders again (a re-delivery), and another order for user 1.
    let again = store
        .insert_batch(vec![order(10, 1), order(11, 2), order(12, 1), order(13, 3)])
        .await
        .unwrap();
    assert_eq!((again.new, again.already_there), (1, 2));
    // Order 12 is user 1's second order (row 10 holds the voucher and user): an
    // anomaly, not a re-delivery.
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

#[tokio::test]
async fn sqlite_inserts_are_idempotent_and_one_per_user() {
    let dir = Dir::new("storage-contract");
    let store = SqliteStore::open(&dir.db()).unwrap();
    inserts_are_idempotent_and_one_per_user(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_inserts_are_idempotent_and_one_per_user() {
    let server = MariaDbServer::start_with_args(DURABLE);
    let store = MySqlStore::connect(&server.url()).await.unwrap();
    inserts_are_idempotent_and_one_per_user(&store).await;
}

/// A re-delivered order whose first copy another worker commits while this batch
/// waits on its row is found, not reported as an anomaly: after a duplicate, the row is
/// read as it is now (read committed), not as the batch's first read saw the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_a_copy_committed_while_the_batch_waits_is_found() {
    use sqlx::Connection;
    let server = MariaDbServer::start_with_args(DURABLE);
    let store = MySqlStore::connect(&server.url()).await.unwrap();
    store.insert_batch(vec![order(10, 1)]).await.unwrap();
    // Another worker's transaction has written order 11, not committed yet.
    let mut other = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let mut tx = other.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO seckill_orders
         (order_id, voucher_id, user_id, created_ms, stream_entry, persisted_ms)
         VALUES (11, 1, 2, 1735689601000, '11-0', 0)",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    // Order 10's duplicate makes the batch read that row (under REPEATABLE READ its
    // snapshot is taken there, without order 11), then order 11 waits.
    let batch = tokio::spawn({
        let store = store.clone();
        async move { store.insert_batch(vec![order(10, 1), order(11, 2)]).await }
    });
    let mut watch = sqlx::MySqlConnection::connect(&server.url()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The batch's INSERT in progress: order 11's, blocked (or, for a moment, order
        // 10's). What InnoDB shows of a transaction waiting on a duplicate key check
        // varies; the statement a connection is running does not.
        let waiting: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST
             WHERE INFO LIKE 'INSERT INTO seckill_orders%'",
        )
        .fetch_one(&mut watch)
        .await
        .unwrap();
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the batch never inserted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tx.commit().await.unwrap();
    let inserted = batch.await.unwrap().unwrap();
    assert_eq!(
        inserted,
        Inserted {
            already_there: 2,
            ..Inserted::default()
        }
    );
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
async fn burst(system: impl FnOnce() -> System) {
    let _alone = one_sale_at_a_time().await;
    let system = system();
    let (a, b) = system.instances(&[]).await;
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
    assert_eq!(system.db.store().await.count().await.unwrap(), 100);
    // Both instances consume, and both endpoints say so, for either queue.
    let kind = match system.queue {
        Queue::Stream => "redis-stream",
        Queue::Rabbit(_) => "rabbitmq",
    };
    let http = Http::new();
    let health = http
        .get(&format!("{}/healthz", a.url))
        .await
        .unwrap()
        .json();
    assert_eq!(
        (&health["queue"]["kind"], &health["queue"]["consumers"]),
        (&kind.into(), &2.into()),
        "{health}"
    );
    let metrics = http.get(&format!("{}/metrics", b.url)).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        format!("seckill_queue_consumers{{kind=\"{kind}\"}} 2"),
        format!("seckill_queue_pending{{kind=\"{kind}\"}} 0"),
        format!("seckill_queue_undelivered{{kind=\"{kind}\"}} 0"),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_2000_buyers_on_sqlite_stream() {
    burst(|| System::sqlite_stream("burst")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_2000_buyers_on_mysql_stream() {
    burst(System::mysql_stream).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_of_2000_buyers_on_mysql_rabbitmq() {
    burst(System::mysql_rabbit).await;
}
