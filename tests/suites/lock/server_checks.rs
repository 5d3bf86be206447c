//! What a client checks of the Redis server when it opens, and how it takes what a
//! server refuses. A server that evicts keys when full (a `maxmemory` with an evicting
//! `maxmemory-policy`) could drop a lock before its lease ends, so it is refused, on
//! one node and on any master of a Cluster. A command the server refuses fails only
//! the call that sent it.

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

/// A server with `SET` renamed away (as hardened deployments do) answers every plain
/// acquisition with an error naming the command and echoing its arguments cut at 128
/// bytes, which can split a character of the lock's name. That answer is the
/// acquisition's alone: the calls sharing its connection go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_command_echoing_a_cut_name_fails_only_its_own_call() {
    let server = RedisServer::start_with_args(&["--rename-command", "SET", ""]);
    let client = open(&server).await.unwrap();
    let limiter = client.rate_limiter("beside", lock_core::RateLimit::per_second(1_000_000));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checkers: Vec<_> = (0..8)
        .map(|_| {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            tokio::spawn(async move {
                let mut peeks = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // A peek: a counted decision would call `SET`.
                    limiter.peek("k").await.map_err(|e| e.to_string())?;
                    peeks += 1;
                }
                Ok::<_, String>(peeks)
            })
        })
        .collect();
    for i in 0..40 {
        // Either parity of the prefix: one of them puts the cut inside a 2-byte 'é'.
        let name = "x".repeat(i % 4) + &"é".repeat(100);
        let e = client.try_lock(&name).await.map(drop).unwrap_err();
        assert!(e.to_string().contains("unknown command 'SET'"), "{e}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in checkers {
        let peeks = c
            .await
            .unwrap()
            .expect("a call beside the refused ones failed");
        assert!(peeks > 0);
    }
}
