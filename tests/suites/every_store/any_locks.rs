//! One lock API over every store: the URL factory (credentials of a multi-host URL on
//! every host), and the same code (generic over `DistributedLock`, and `#[cache_lock]`)
//! on Redis, Redlock, memory, PostgreSQL, MariaDB, ZooKeeper and etcd.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lock_core::{AnyLocks, DistributedLock, HeldLock, LockConfig, LockError};
use lock_macros::cache_lock;
use lock_tests::{
    EtcdCluster, MariaDbServer, PostgresServer, RedisCluster, RedisMasters, RedisServer,
    ZooKeeperServer,
};

/// 8 tasks x 10 rounds on one name: never two inside; then a held lock is busy to others.
async fn exclusion<L>(what: &'static str, locks: Arc<L>)
where
    L: DistributedLock + 'static,
{
    let inside = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (locks, inside) = (locks.clone(), inside.clone());
            tokio::spawn(async move {
                for _ in 0..10 {
                    let g = locks.lock_named("shared").await.unwrap();
                    assert!(g.is_held(), "{what}: {:?}", g.valid_for());
                    // Taken now where the store takes tokens on demand (Redis); a
                    // Redlock grant has one only when its first node granted.
                    let token = g.fence().await.unwrap();
                    if !what.starts_with("redlock") {
                        assert!(token.is_some(), "{what}: no token");
                    }
                    assert_eq!(g.token(), token, "{what}: the token is kept");
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let busy = {
        let _g = locks.try_lock_named("shared").await.unwrap();
        let other = locks.clone();
        tokio::spawn(async move { other.try_lock_named("shared").await.map(drop) })
            .await
            .unwrap()
    };
    assert!(busy.unwrap_err().is_busy());
}

#[cache_lock(prefix = "pay", key = order, client = locks, wait = "0ms")]
async fn pay(
    locks: &AnyLocks,
    order: u64,
    gate: Arc<tokio::sync::Barrier>,
) -> Result<(), LockError> {
    gate.wait().await;
    gate.wait().await;
    Ok(())
}

/// `#[cache_lock]` with an `AnyLocks` client: a duplicate call is refused as busy.
async fn macro_refuses_a_duplicate(locks: AnyLocks) {
    let gate = Arc::new(tokio::sync::Barrier::new(2));
    let first = {
        let (locks, gate) = (locks.clone(), gate.clone());
        tokio::spawn(async move { pay(&locks, 9, gate).await })
    };
    gate.wait().await; // the first call holds the lock now
    let second = pay(&locks, 9, Arc::new(tokio::sync::Barrier::new(1))).await;
    assert!(second.unwrap_err().is_busy());
    gate.wait().await;
    first.await.unwrap().unwrap();
}

fn config() -> LockConfig {
    LockConfig::new().with_wait(Duration::from_secs(10))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_url_opens_its_store_and_the_same_code_runs_on_each() {
    let redis = RedisServer::start();
    let masters = RedisServer::start_many(3);
    let postgres = PostgresServer::start();
    let mariadb = MariaDbServer::start();
    let zookeeper = ZooKeeperServer::start();
    let etcd = EtcdCluster::start(3);
    let hosts: Vec<String> = masters
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let urls = [
        redis.url(),
        format!("redlock://{}", hosts.join(",")),
        "memory://".to_owned(),
        postgres.url(),
        mariadb.url(),
        mariadb.url().replacen("mysql://", "mariadb://", 1),
        format!("zk://{}", zookeeper.connect_string()),
        etcd.url("any"),
    ];
    for url in urls {
        let locks = AnyLocks::open(&url, config()).await.unwrap();
        exclusion(url.clone().leak(), Arc::new(locks.clone())).await;
        macro_refuses_a_duplicate(locks).await;
    }
}

/// Servers whose default user may only `PING`, `INFO` and `CLUSTER` (the harness's
/// readiness and cluster-forming calls); `locker` / `secret` may do anything.
const ACL: &[&str] = &[
    "--user", "default", "on", "nopass", "-@all", "+ping", "+info", "+cluster", "--user", "locker",
    "on", ">secret", "~*", "&*", "+@all",
];

fn host_list(ports: impl Iterator<Item = u16>) -> String {
    ports
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_and_cluster_urls_sign_in_on_every_host() {
    let masters = RedisMasters::start_with_args(3, ACL);
    let hosts = host_list(masters.iter().map(|m| m.port()));
    let url = format!("redlock://locker:secret@{hosts}");
    let locks = AnyLocks::open(&url, config()).await.unwrap();
    let g = locks.try_lock_named("paid").await.unwrap();
    let key = lock_core::key::lock_keys("lock", ":", "paid").unwrap().key;
    for node in masters.iter() {
        let url = format!("redis://locker:secret@127.0.0.1:{}/", node.port());
        let client = redis::Client::open(url).unwrap();
        let mut c = lock_tests::connect(&client).await.unwrap();
        let copies: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(copies, 1, "no copy of the lock on node {}", node.port());
    }
    g.release().await.unwrap();

    let cluster = RedisCluster::start_with_args(3, 0, ACL);
    let url = format!("redis+cluster://locker:secret@{}", cluster.hosts());
    let locks = AnyLocks::open(&url, config()).await.unwrap();
    exclusion("redis+cluster with credentials", Arc::new(locks)).await;
}

#[tokio::test]
async fn bad_urls_get_errors_that_say_what_to_do() {
    for (url, says) in [
        ("localhost:6379", "no scheme"),
        ("ftp://x", "unknown lock store scheme"),
        ("redlock://", "at least one host"),
    ] {
        let err = AnyLocks::open(url, LockConfig::new()).await.unwrap_err();
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(err.to_string().contains(says), "{url}: {err}");
    }
    // The errors name the URL, without its passwords.
    for (url, says) in [
        ("locker:s3cret@h1:6379", "no scheme"),
        (
            "redis-cluster://locker:s3cret@h1:7000,b:t0p@h2:7000",
            "unknown lock store scheme",
        ),
        ("redlock://locker:s3cret@", "at least one host"),
    ] {
        let err = AnyLocks::open(url, LockConfig::new()).await.unwrap_err();
        let text = err.to_string();
        assert!(text.contains(says), "{url}: {err}");
        assert!(text.contains("locker"), "{url}: the user is kept: {err}");
        assert!(
            !text.contains("s3cret") && !text.contains("t0p"),
            "{url}: a password in the error: {err}"
        );
    }
}
