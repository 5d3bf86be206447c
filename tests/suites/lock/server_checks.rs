//! What a client checks of the Redis server when it opens: a server that evicts keys
//! when full (a `maxmemory` with an evicting `maxmemory-policy`) could drop a lock
//! before its lease ends, so it is refused, on one node and on any master of a Cluster.

use lock_core::{LockClient, LockConfig, LockError};
use lock_tests::{RedisCluster, RedisServer};

async fn open(server: &RedisServer) -> Result<LockClient, LockError> {
    LockClient::open(server.url()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_evicts_keys_when_full_is_refused_at_open() {
    for policy in ["volatile-lru", "allkeys-lru"] {
        let server =
            RedisServer::start_with_args(&["--maxmemory", "100mb", "--maxmemory-policy", policy]);
        match open(&server).await {
            Err(e @ LockError::EvictingRedis { .. }) => {
                let message = e.to_string();
                assert!(
                    message.contains(policy) && message.contains("noeviction"),
                    "{message}"
                );
            }
            other => panic!(
                "{policy}: expected EvictingRedis, got {:?}",
                other.map(|_| ())
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_evict_a_lock_is_accepted() {
    let no_eviction =
        RedisServer::start_with_args(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]);
    open(&no_eviction).await.unwrap();
    // An evicting policy with no maxmemory evicts nothing (accepted with a warning).
    let unbounded = RedisServer::start_with_args(&["--maxmemory-policy", "allkeys-lru"]);
    open(&unbounded).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_with_one_evicting_master_is_refused_naming_it() {
    let cluster = RedisCluster::start(3, 0);
    let master = cluster.masters()[1];
    let port = cluster.node(master).port();
    let mut c = cluster.node(master).connection().await;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("100mb")
        .arg("maxmemory-policy")
        .arg("volatile-ttl")
        .exec_async(&mut c)
        .await
        .unwrap();
    match LockClient::open_cluster(cluster.urls(), LockConfig::new()).await {
        Err(LockError::EvictingRedis { policy, node, .. }) => {
            assert_eq!(policy, "volatile-ttl");
            let node = node.expect("the master is named");
            assert!(node.ends_with(&format!(":{port}")), "{node}");
        }
        other => panic!("expected EvictingRedis, got {:?}", other.map(|_| ())),
    }
}
