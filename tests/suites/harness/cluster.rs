//! Self-test of the multi-node harness: [`RedisMasters`] (independent
//! servers) and [`RedisCluster`] (a real Redis Cluster), including the
//! failovers and the replication breaking the lock suites rely on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use lock_tests::{CLUSTER_SLOTS, FailoverMode, RedisCluster, RedisMasters, Role, key_slot};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::timeout;

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// A connection to one cluster node that may read from a replica.
async fn readonly_connection(cluster: &RedisCluster, index: usize) -> MultiplexedConnection {
    let mut conn = cluster.node(index).connection().await;
    let () = redis::cmd("READONLY").query_async(&mut conn).await.unwrap();
    conn
}

/// Polls `GET key` on node `index` (with `READONLY`) until it returns `want`.
async fn await_value_on_node(cluster: &RedisCluster, index: usize, key: &str, want: &str) {
    let mut conn = readonly_connection(cluster, index).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value: Option<String> = conn.get(key).await.unwrap();
        if value.as_deref() == Some(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} never became {want:?} on node #{index} (port {}): last {value:?}",
            cluster.node(index).port()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One key per master: `key-N` for the first N landing on each master's slots.
fn key_per_master(cluster: &RedisCluster) -> Vec<(usize, String)> {
    let masters = cluster.masters();
    let mut keys: Vec<(usize, String)> = Vec::new();
    for n in 0.. {
        let key = format!("key-{n}");
        let master = cluster.master_for_key(&key);
        if !keys.iter().any(|(m, _)| *m == master) {
            keys.push((master, key));
        }
        if keys.len() == masters.len() {
            break;
        }
    }
    keys.sort();
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_masters_kill_restart_pause() {
    let mut masters = RedisMasters::start(5);
    assert_eq!(masters.len(), 5);
    let ports: BTreeSet<u16> = masters.iter().map(|s| s.port()).collect();
    assert_eq!(ports.len(), 5, "every server has its own port");
    assert_eq!(masters.urls()[2], masters[2].url());

    for (i, client) in masters.clients().into_iter().enumerate() {
        let mut conn = lock_tests::connect(&client).await.unwrap();
        let () = conn.set("who", i).await.unwrap();
    }
    for (i, server) in masters.iter().enumerate() {
        let who: usize = server.connection().await.get("who").await.unwrap();
        assert_eq!(who, i, "the servers are independent");
    }

    let before: Vec<u16> = masters.iter().map(|s| s.port()).collect();
    masters[1].kill();
    masters[3].kill();
    for i in [1, 3] {
        assert!(!masters[i].is_running());
        assert!(
            masters[i]
                .client()
                .get_multiplexed_async_connection()
                .await
                .is_err(),
            "killed server {i} still accepts connections"
        );
    }
    masters[1].restart();
    masters[3].restart();
    let after: Vec<u16> = masters.iter().map(|s| s.port()).collect();
    assert_eq!(before, after, "restarts keep the ports");
    for server in masters.iter() {
        assert_eq!(ping(&mut server.connection().await).await.unwrap(), "PONG");
    }

    let mut conn = masters[4].connection().await;
    masters[4].pause();
    assert!(masters[4].is_paused());
    let hung = timeout(Duration::from_millis(200), ping(&mut conn)).await;
    assert!(hung.is_err(), "a paused server answered: {hung:?}");
    masters[4].resume();
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_forms_with_one_replica_per_master() {
    let cluster = RedisCluster::start(3, 1);
    assert_eq!(cluster.len(), 6);
    let nodes = cluster.nodes();
    let masters: Vec<_> = nodes.iter().filter(|n| n.role == Role::Master).collect();
    assert_eq!(masters.len(), 3, "{nodes:?}");
    assert_eq!(cluster.masters(), [0, 1, 2]);
    assert_eq!(cluster.master_urls().len(), 3);
    assert_eq!(cluster.urls().len(), 6);
    let served: u32 = masters
        .iter()
        .flat_map(|m| m.slots.iter())
        .map(|r| u32::from(r.end() - r.start()) + 1)
        .sum();
    assert_eq!(served, u32::from(CLUSTER_SLOTS));
    for node in &nodes {
        assert_eq!(node.id.len(), 40, "{node:?}");
        assert_eq!(node.id, cluster.node_id(node.index));
        assert_eq!(node.port, cluster.node(node.index).port());
    }
    for master in 0..3 {
        let replica = cluster.replica_of(master);
        assert_eq!(cluster.replicas_of(master), [replica]);
        assert_eq!(nodes[replica].role, Role::Replica { master });
        assert!(nodes[replica].slots.is_empty());
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut cluster.node(replica).connection().await)
            .await
            .unwrap();
        assert!(info.contains("master_link_status:up"), "{info}");
    }
    let log = cluster.node(0).log();
    assert!(log.contains("Cluster state changed: ok"), "{log}");

    // The harness's slot computation agrees with the server's.
    let mut conn = cluster.node(0).connection().await;
    for key in [
        "foo",
        "{user1000}.following",
        "a{b}c",
        "{}x",
        "lock:order:42",
        "",
    ] {
        let server: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(key_slot(key), server, "slot of {key:?}");
        let master = cluster.master_for_key(key);
        assert!(
            nodes[master]
                .slots
                .iter()
                .any(|r| r.contains(&key_slot(key)))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_client_writes_to_every_master_and_follows_a_failover() {
    let cluster = RedisCluster::start(3, 1);
    let mut conn = cluster.connection().await;
    let keys = key_per_master(&cluster);
    assert_eq!(
        keys.iter().map(|(m, _)| *m).collect::<Vec<_>>(),
        [0, 1, 2],
        "{keys:?}"
    );
    for (master, key) in &keys {
        let () = conn.set(key, format!("on-{master}")).await.unwrap();
    }
    for (master, key) in &keys {
        let value: String = conn.get(key).await.unwrap();
        assert_eq!(value, format!("on-{master}"));
        // The key really lives on that master, not elsewhere.
        let local: Option<String> = cluster
            .node(*master)
            .connection()
            .await
            .get(key)
            .await
            .unwrap();
        assert_eq!(
            local,
            Some(format!("on-{master}")),
            "{key} on node {master}"
        );
    }

    let (master, key) = keys[1].clone();
    let replica = cluster.replica_of(master);
    cluster.failover(replica, FailoverMode::Coordinated);
    assert_eq!(cluster.master_for_key(&key), replica);
    let nodes = cluster.nodes();
    assert_eq!(nodes[replica].role, Role::Master);
    assert_eq!(nodes[master].role, Role::Replica { master: replica });
    assert_eq!(cluster.masters().len(), 3);
    assert!(cluster.masters().contains(&replica));

    // The connection made before the failover gets MOVED and follows it.
    let value: String = conn.get(&key).await.unwrap();
    assert_eq!(
        value,
        format!("on-{master}"),
        "a coordinated failover loses nothing"
    );
    let () = conn.set(&key, "after-failover").await.unwrap();
    let local: Option<String> = cluster
        .node(replica)
        .connection()
        .await
        .get(&key)
        .await
        .unwrap();
    assert_eq!(local.as_deref(), Some("after-failover"));
    for (_, other) in keys.iter().filter(|(m, _)| *m != master) {
        let _: String = conn.get(other).await.unwrap();
    }

    // And back: the demoted master is a working replica again.
    cluster.wait_stable();
    cluster.failover(master, FailoverMode::Coordinated);
    assert_eq!(cluster.master_for_key(&key), master);
    let value: String = conn.get(&key).await.unwrap();
    assert_eq!(value, "after-failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn break_replication_then_takeover_loses_the_write() {
    let cluster = RedisCluster::start(3, 1);
    let mut conn = cluster.connection().await;
    let (before, after) = ("{lost}:before", "{lost}:after");
    let master = cluster.master_for_key(before);
    assert_eq!(cluster.master_for_key(after), master);
    let replica = cluster.replica_of(master);

    let () = conn.set(before, "replicated").await.unwrap();
    await_value_on_node(&cluster, replica, before, "replicated").await;

    cluster.break_replication(replica);
    let () = conn.set(after, "lost").await.unwrap();
    let mut on_master = cluster.node(master).connection().await;
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(300)
        .query_async(&mut on_master)
        .await
        .unwrap();
    assert_eq!(acked, 0, "a replica acknowledged the write");
    let mut on_replica = readonly_connection(&cluster, replica).await;
    let seen: Option<String> = on_replica.get(after).await.unwrap();
    assert_eq!(seen, None, "the write reached the broken replica");
    // The cluster still sees a healthy replica.
    assert_eq!(
        cluster.nodes()[replica].role,
        Role::Replica { master },
        "break_replication changes no role"
    );

    cluster.failover(replica, FailoverMode::Takeover);
    assert_eq!(cluster.master_for_key(after), replica);
    let lost: Option<String> = conn.get(after).await.unwrap();
    assert_eq!(
        lost, None,
        "the takeover kept a write the replica never got"
    );
    let kept: Option<String> = conn.get(before).await.unwrap();
    assert_eq!(kept.as_deref(), Some("replicated"));

    // The old master re-syncs from the new one and drops the write too.
    cluster.wait_stable();
    assert_eq!(
        cluster.nodes()[master].role,
        Role::Replica { master: replica }
    );
    let mut on_old_master = readonly_connection(&cluster, master).await;
    let gone: Option<String> = on_old_master.get(after).await.unwrap();
    assert_eq!(gone, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_replication_catches_up() {
    let cluster = RedisCluster::start(1, 1);
    let mut conn = cluster.connection().await;
    cluster.break_replication(1);
    let () = conn.set("k", "missed").await.unwrap();
    let seen: Option<String> = readonly_connection(&cluster, 1)
        .await
        .get("k")
        .await
        .unwrap();
    assert_eq!(seen, None);
    cluster.restore_replication(1);
    await_value_on_node(&cluster, 1, "k", "missed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_master_is_replaced_and_rejoins_as_replica() {
    let mut cluster = RedisCluster::start(3, 1);
    let mut conn = cluster.connection().await;
    let key = "{killed}";
    let master = cluster.master_for_key(key);
    let replica = cluster.replica_of(master);
    let () = conn.set(key, "v").await.unwrap();
    await_value_on_node(&cluster, replica, key, "v").await;

    cluster.kill(master);
    cluster.wait_stable();
    assert_eq!(cluster.master_for_key(key), replica);
    let value: String = conn.get(key).await.unwrap();
    assert_eq!(value, "v");

    let id = cluster.node_id(master).to_owned();
    cluster.restart(master);
    cluster.wait_stable();
    let nodes = cluster.nodes();
    assert_eq!(nodes[master].id, id, "a restarted node keeps its id");
    assert_eq!(nodes[master].role, Role::Replica { master: replica });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_replica_is_waited_for_after_resume() {
    let cluster = RedisCluster::start(2, 1);
    let replica = cluster.replica_of(0);
    cluster.pause(replica);
    assert!(cluster.node(replica).is_paused());
    // Paused nodes are left out of the checks, so the rest looks stable.
    cluster.wait_stable();
    cluster.resume(replica);
    cluster.wait_stable();
    assert_eq!(cluster.nodes()[replica].role, Role::Replica { master: 0 });
}

#[test]
fn a_node_that_does_not_start_names_its_port_and_log() {
    let result = std::panic::catch_unwind(|| {
        RedisCluster::start_with_args(2, 1, &["--no-such-directive", "1"])
    });
    let payload = result.expect_err("starting the cluster should have panicked");
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| panic!("panic payload is not a String"));
    assert!(
        message.contains("did not come up on 127.0.0.1:"),
        "{message}"
    );
    assert!(message.contains("no-such-directive"), "{message}");
    assert!(message.contains("redis-server log, port"), "{message}");
}
