//! A Redis Cluster connection that breaks after the server ran a call and before its
//! reply arrived: the call must not be sent again behind the caller's back. Every
//! master is reached through a TCP proxy (each announces its proxy's port), which resets
//! the connection carrying one chosen request as soon as the server answers it.
//! Sent again, a `SET NX` would find its own value (busy), a release nothing (expired),
//! a rate-limit check would count twice, an idempotency claim find itself in flight.

use crate::common;

use std::time::{Duration, Instant};

use common::eventually;
use lock_core::{Begin, LockClient, LockConfig, RateLimit};
use lock_tests::{RedisCluster, TcpProxy};

/// How long an undo or a reconnection may take.
const WITHIN: Duration = Duration::from_secs(5);

/// A cluster whose clients reach every master through its own proxy.
struct Proxied {
    cluster: RedisCluster,
    proxies: Vec<TcpProxy>,
}

impl Proxied {
    async fn start() -> Proxied {
        let cluster = RedisCluster::start(3, 0);
        let mut proxies = Vec::new();
        for master in cluster.masters() {
            let node = cluster.node(master);
            let proxy = TcpProxy::start(node.port());
            let mut c = node.connection().await;
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("cluster-announce-port")
                .arg(proxy.port())
                .exec_async(&mut c)
                .await
                .unwrap();
            proxies.push(proxy);
        }
        let proxied = Proxied { cluster, proxies };
        proxied.wait_announced().await;
        proxied
    }

    /// Until every node's slot map routes every slot through a proxy.
    async fn wait_announced(&self) {
        let ports: Vec<i64> = self.proxies.iter().map(|p| i64::from(p.port())).collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut all = true;
            for i in 0..self.cluster.len() {
                let mut c = self.cluster.node(i).connection().await;
                let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async(&mut c)
                    .await
                    .unwrap();
                all &= slots.iter().all(|range| match range {
                    redis::Value::Array(items) => match items.get(2) {
                        Some(redis::Value::Array(master)) => {
                            matches!(master.get(1), Some(redis::Value::Int(p)) if ports.contains(p))
                        }
                        _ => false,
                    },
                    _ => false,
                });
            }
            if all {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the proxied ports were not announced"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn client(&self) -> LockClient {
        let seeds: Vec<String> = self.proxies.iter().map(TcpProxy::url).collect();
        LockClient::open_cluster(seeds, LockConfig::new().with_batching(false))
            .await
            .unwrap()
    }

    /// The next request with all of `parts` in it loses its reply.
    fn lose_reply_to(&self, parts: &[&str]) {
        for proxy in &self.proxies {
            let parts: Vec<Vec<u8>> = parts.iter().map(|p| p.as_bytes().to_vec()).collect();
            proxy.reset_reply_to(move |chunk| parts.iter().all(|p| contains(chunk, p)));
        }
    }

    async fn get(&self, key: &str) -> Option<String> {
        let mut c = self.cluster.connection().await;
        redis::cmd("GET")
            .arg(key)
            .query_async(&mut c)
            .await
            .unwrap()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_whose_reply_was_lost_is_not_answered_busy_by_its_own_grant() {
    let proxied = Proxied::start().await;
    let client = proxied.client().await;
    let other = proxied.client().await;

    // An acquisition: its SET ran, its reply was lost.
    let key = client.keys("resent-set").unwrap().key;
    proxied.lose_reply_to(&[&key, "NX"]);
    match client.try_lock("resent-set").await {
        Err(e) => assert!(e.is_redis() && !e.is_busy(), "{e}"),
        Ok(_) => panic!("a reply that never arrived granted the lock"),
    }
    // The grant it may have made is undone, so another owner gets the lock at once
    // rather than after the 30 s lease.
    eventually(WITHIN, "the undone grant to free the lock", || async {
        other.try_lock("resent-set").await.is_ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_was_lost_is_not_reported_expired() {
    let proxied = Proxied::start().await;
    let client = proxied.client().await;

    // A release: it deleted the grant, its reply was lost. (A first cycle loads the
    // release script on that node.)
    let guard = client.try_lock("resent-release").await.unwrap();
    guard.release().await.unwrap();
    let guard = client.try_lock("resent-release").await.unwrap();
    let key = guard.keys().key.clone();
    proxied.lose_reply_to(&[&key, "EVALSHA"]);
    match guard.release().await {
        Err(e) => assert!(e.is_redis() && !e.is_lost(), "{e}"),
        Ok(r) => panic!("a release whose reply was lost answered {r:?}"),
    }
    assert_eq!(proxied.get(&key).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_check_whose_reply_was_lost_counts_once() {
    let proxied = Proxied::start().await;
    let client = proxied.client().await;

    // A rate-limit decision: counted once.
    let limiter = client.rate_limiter("resent-gcra", RateLimit::per_minute(10).with_burst(10));
    // Counted too; it also loads the script on that node, so the lost call runs it
    // rather than meeting NOSCRIPT.
    limiter.check("k").await.unwrap();
    proxied.lose_reply_to(&["resent-gcra", "EVALSHA"]);
    assert!(limiter.check("k").await.unwrap_err().is_redis());
    // The next call on the broken connection may fail while it reconnects; `peek`
    // counts nothing.
    eventually(WITHIN, "the connection to come back", || async {
        limiter.peek("k").await.is_ok()
    })
    .await;
    let second = limiter.check("k").await.unwrap();
    // What three counted checks leave: the first, the lost one and this one.
    limiter.check("fresh").await.unwrap();
    limiter.check("fresh").await.unwrap();
    let three = limiter.check("fresh").await.unwrap();
    assert_eq!(
        second.remaining,
        three.remaining,
        "the check whose reply was lost counted {} times",
        1 + i64::from(three.remaining) - i64::from(second.remaining)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_claim_whose_reply_was_lost_does_not_find_itself_in_flight() {
    let proxied = Proxied::start().await;
    let client = proxied.client().await;

    // An idempotency claim: it is not answered "in flight" by its own first write.
    let store = client.idempotency_store("resent-claim");
    let record = store.keys("order-1").unwrap().record;
    proxied.lose_reply_to(&[&record, "NX"]);
    let lease = Duration::from_secs(30);
    match store.begin("order-1", "fp", lease).await {
        Err(e) => assert!(e.is_redis(), "{e}"),
        Ok(found) => panic!("a claim whose reply was lost answered {found:?}"),
    }
    eventually(
        WITHIN,
        "the claim that may have been made to be abandoned",
        || async { matches!(store.begin("order-1", "fp", lease).await, Ok(Begin::New(_))) },
    )
    .await;
}
