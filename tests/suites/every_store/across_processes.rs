//! Mutual exclusion across OS processes on every store that reaches across processes:
//! 2 processes x 16 tasks x 200 acquisitions over 4 keys (100 on etcd), each guarding a
//! deliberately non-atomic GET / sleep / SET of a counter on a redis-server. `memory://`
//! is left out: it is a store of one process, and two processes never exclude each
//! other.

use std::process::{Command, Stdio};

use lock_tests::{
    EtcdCluster, MariaDbServer, PostgresServer, RedisCluster, RedisServer, ZooKeeperServer,
};
use redis::AsyncCommands;

const TASKS: u64 = 16;
const ITERS: u64 = 200;
/// On etcd every acquisition commits through Raft on three members and wakes its
/// successor by a watch: about three times the CPU of the next store's, so half as many
/// (3200 critical sections) keep its test beside the others' in time.
const ETCD_ITERS: u64 = 100;
const KEYS: usize = 4;

/// Runs two worker processes of `iters` acquisitions per task locking on `lock_url`,
/// counters on `data`; returns (per-key acquisitions, per-key counter values).
async fn run_two_processes(
    lock_url: &str,
    data: &RedisServer,
    iters: u64,
    extra: &[&str],
) -> (Vec<u64>, Vec<u64>) {
    let data_url = data.url();
    let (tasks, iters, keys) = (TASKS.to_string(), iters.to_string(), KEYS.to_string());
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args(["count", lock_url, &tasks, &iters, &keys, "300"])
            .args(["--data", &data_url])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn lock-worker")
    };
    let workers = [spawn(), spawn()];
    let mut acquired = vec![0u64; KEYS];
    for w in workers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output())
            .await
            .unwrap()
            .expect("worker output");
        assert!(out.status.success(), "worker failed: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("done "))
            .unwrap_or_else(|| panic!("no result line in {text:?}"));
        for (k, n) in line.split(' ').enumerate() {
            acquired[k] += n.parse::<u64>().unwrap();
        }
    }
    let mut conn = data.connection().await;
    let mut counters = Vec::new();
    for k in 0..KEYS {
        let v: Option<u64> = conn.get(format!("counter:{k}")).await.unwrap();
        counters.push(v.unwrap_or(0));
    }
    (acquired, counters)
}

/// Two processes on `lock_url`: every update survives.
async fn never_overlap(lock_url: &str, data: &RedisServer, extra: &[&str]) {
    never_overlap_in(lock_url, data, ITERS, extra).await;
}

/// As [`never_overlap`] with `iters` acquisitions per task.
async fn never_overlap_in(lock_url: &str, data: &RedisServer, iters: u64, extra: &[&str]) {
    let (acquired, counters) = run_two_processes(lock_url, data, iters, extra).await;
    assert_eq!(acquired.iter().sum::<u64>(), 2 * TASKS * iters);
    assert_eq!(
        counters, acquired,
        "{lock_url}: a lost update means two holders overlapped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_processes_never_overlap() {
    let server = RedisServer::start();
    never_overlap(&server.url(), &server, &[]).await;
}

/// The same with every call its own command (batching off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_processes_never_overlap_without_batching() {
    let server = RedisServer::start();
    never_overlap(&server.url(), &server, &["--no-batching"]).await;
}

/// The same workload without the lock loses updates: the tests here can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_updates_are_lost() {
    let server = RedisServer::start();
    let (acquired, counters) =
        run_two_processes(&server.url(), &server, ITERS, &["--no-lock"]).await;
    assert_eq!(acquired.iter().sum::<u64>(), 2 * TASKS * ITERS);
    assert!(
        counters.iter().sum::<u64>() < acquired.iter().sum::<u64>(),
        "expected lost updates without a lock: {counters:?} vs {acquired:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_two_processes_never_overlap() {
    let cluster = RedisCluster::start(3, 0);
    let data = RedisServer::start();
    never_overlap(&format!("redis+cluster://{}", cluster.hosts()), &data, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_two_processes_never_overlap() {
    let masters = RedisServer::start_many(3);
    let data = RedisServer::start();
    let hosts: Vec<String> = masters
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.port()))
        .collect();
    never_overlap(&format!("redlock://{}", hosts.join(",")), &data, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_two_processes_never_overlap() {
    let server = PostgresServer::start();
    let data = RedisServer::start();
    never_overlap(&server.url(), &data, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_two_processes_never_overlap() {
    let server = MariaDbServer::start();
    let data = RedisServer::start();
    never_overlap(&server.url(), &data, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_two_processes_never_overlap() {
    let server = ZooKeeperServer::start();
    let data = RedisServer::start();
    never_overlap(&format!("zk://{}", server.connect_string()), &data, &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_two_processes_never_overlap() {
    let cluster = EtcdCluster::start(3);
    let data = RedisServer::start();
    never_overlap_in(&cluster.url("processes"), &data, ETCD_ITERS, &[]).await;
}
