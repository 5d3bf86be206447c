//! A fair lock is granted in arrival order on every store that offers one. The stores
//! whose waiters queue in the server grant any lock so: ZooKeeper (sequential nodes),
//! etcd (create revisions), PostgreSQL (the lock manager's wait queue) and
//! MySQL/MariaDB (`GET_LOCK`'s metadata-lock queue); Redis (node and Cluster, in this
//! crate's layout and in Redisson's) and memory keep a line for fair locks. Each waiter
//! is started only once the store shows the one before it queued, so the order of
//! arrival is the store's own, not a guess.
//!
//! The line on Redis and memory also lets a waiter go: one that leaves (a timeout, a
//! cancelled future) gives up its place at once, one that vanished holds the line up
//! until its place lapses and no longer.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::eventually;

use lock_core::etcd_client as etcd;
use lock_core::zookeeper_client as zk;
use lock_core::{DistributedLock, HeldLock, LockConfig, LockOptions};
use lock_tests::{
    EtcdCluster, MariaDbServer, PostgresServer, RedisCluster, RedisServer, ZooKeeperServer,
};

const WAITERS: usize = 6;

/// How many waiters the store shows queued for the lock now.
pub(super) type Queued = Box<dyn Fn() -> Pin<Box<dyn Future<Output = usize> + Send>> + Send + Sync>;

fn config() -> LockConfig {
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(1_500))
        .with_command_timeout(Duration::from_secs(2))
        .with_wait(Duration::from_secs(30))
}

/// One holder on the first handle and a fair waiter on each of the others (handles are
/// clients, pools or sessions of their own: a client's scopes may take turns before
/// they queue in the store), each started once `queued` shows the ones before it.
/// Released, they must be granted in the order they queued.
async fn granted_in_arrival_order<L, F, Fut>(open: F, queued: Queued)
where
    L: DistributedLock + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<L, lock_core::LockError>>,
{
    let holder_locks = open().await.unwrap();
    let holder = holder_locks.lock_named("fifo").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (locks, order) = (open().await.unwrap(), order.clone());
        waiters.push(tokio::spawn(async move {
            let g = locks
                .acquire(
                    "fifo",
                    LockOptions::new().fair().wait(Duration::from_secs(30)),
                )
                .await
                .unwrap();
            order.lock().unwrap().push(i);
            g.release().await.unwrap();
        }));
        eventually(Duration::from_secs(10), "the waiter queued", || {
            let shown = queued();
            async move { shown.await == i + 1 }
        })
        .await;
    }
    holder.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..WAITERS).collect::<Vec<_>>(), "grant order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_grants_in_arrival_order() {
    let server = ZooKeeperServer::start();
    let at = server.connect_string();
    let open = || lock_core::ZkLocks::connect(&at, config());
    let dir = open().await.unwrap().lock_path("fifo").unwrap();
    let raw = zk::Client::connect(&server.connect_string()).await.unwrap();
    let queued: Queued = Box::new(move || {
        let (raw, dir) = (raw.clone(), dir.clone());
        Box::pin(async move {
            let children = raw.list_children(&dir).await.unwrap_or_default();
            children.len().saturating_sub(1)
        })
    });
    granted_in_arrival_order(open, queued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_grants_in_arrival_order() {
    let cluster = EtcdCluster::start(3);
    let url = cluster.url("fifo");
    let open = || lock_core::EtcdLocks::connect(&url, config());
    let prefix = format!("{}/", open().await.unwrap().lock_prefix("fifo").unwrap());
    let raw = etcd::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let queued: Queued = Box::new(move || {
        let (mut raw, prefix) = (raw.clone(), prefix.clone());
        Box::pin(async move {
            let options = etcd::GetOptions::new().with_prefix().with_count_only();
            let n = raw.get(prefix, Some(options)).await.unwrap().count();
            usize::try_from(n).unwrap().saturating_sub(1)
        })
    });
    granted_in_arrival_order(open, queued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_grants_in_arrival_order() {
    let server = PostgresServer::start();
    let url = server.url();
    let open = || lock_core::PostgresLocks::connect(&url, config());
    let raw = sqlx::PgPool::connect(&server.url()).await.unwrap();
    let queued: Queued = Box::new(move || {
        let raw = raw.clone();
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(&raw)
            .await
            .unwrap();
            usize::try_from(n).unwrap()
        })
    });
    granted_in_arrival_order(open, queued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_grants_in_arrival_order() {
    let server = MariaDbServer::start();
    let url = server.url();
    let open = || lock_core::MysqlLocks::connect(&url, config());
    let raw = sqlx::MySqlPool::connect(&server.url()).await.unwrap();
    let queued: Queued = Box::new(move || {
        let raw = raw.clone();
        Box::pin(async move {
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'",
            )
            .fetch_one(&raw)
            .await
            .unwrap();
            usize::try_from(n).unwrap()
        })
    });
    granted_in_arrival_order(open, queued).await;
}

/// Waiters in the line of the fair lock `lock:{<name>}` on Redis.
pub(super) fn redis_line(raw: redis::aio::MultiplexedConnection, name: &'static str) -> Queued {
    list_length(raw, format!("lock:{{{name}}}:queue"))
}

/// Waiters in the Redis list `line`.
fn list_length(raw: redis::aio::MultiplexedConnection, line: String) -> Queued {
    Box::new(move || {
        let (mut raw, line) = (raw.clone(), line.clone());
        Box::pin(async move {
            let n: usize = redis::cmd("LLEN")
                .arg(line)
                .query_async(&mut raw)
                .await
                .unwrap();
            n
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fair_lock_grants_in_arrival_order() {
    let server = RedisServer::start();
    let url = server.url();
    let open = || lock_core::LockClient::open_with_config(url.as_str(), config());
    granted_in_arrival_order(open, redis_line(server.connection().await, "fifo")).await;
}

/// One client's waiters each stand in the line as their own scope, and a release
/// wakes the head of the line among them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_fair_lock_orders_the_scopes_of_one_client() {
    let server = RedisServer::start();
    let client = lock_core::LockClient::open_with_config(server.url(), config())
        .await
        .unwrap();
    let open = || std::future::ready(Ok(client.clone()));
    granted_in_arrival_order(open, redis_line(server.connection().await, "fifo")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_fair_lock_grants_in_arrival_order() {
    let cluster = RedisCluster::start(3, 0);
    let url = format!("redis+cluster://{}", cluster.hosts());
    let open = || lock_core::AnyLocks::open(&url, config());
    let node = cluster.master_for_key("lock:{fifo}:queue");
    let raw = cluster.node(node).connection().await;
    granted_in_arrival_order(open, redis_line(raw, "fifo")).await;
}

/// Redisson's layout: the line is `RFairLock`'s queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_fair_lock_grants_in_arrival_order() {
    let server = RedisServer::start();
    let url = format!("redisson://127.0.0.1:{}", server.port());
    let open = || lock_core::AnyLocks::open(&url, config());
    let queued = list_length(
        server.connection().await,
        "redisson_lock_queue:{fifo}".into(),
    );
    granted_in_arrival_order(open, queued).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_fair_lock_grants_in_arrival_order() {
    let locks = lock_core::MemoryLocks::with_config(config()).unwrap();
    let open = || std::future::ready(Ok(locks.clone()));
    let probe = locks.clone();
    let queued: Queued = Box::new(move || {
        let n = probe.in_line("fifo").unwrap();
        Box::pin(std::future::ready(n))
    });
    granted_in_arrival_order(open, queued).await;
}
