//! Mutual exclusion across OS processes: 2 processes x 16 tasks x 200 acquisitions over
//! 4 keys, each guarding a deliberately non-atomic GET / sleep / SET.

use std::process::{Command, Stdio};

use lock_tests::RedisServer;
use redis::AsyncCommands;

const TASKS: &str = "16";
const ITERS: &str = "200";
const KEYS: usize = 4;

/// Runs two worker processes and returns (per-key acquisitions, per-key counter values).
async fn run_two_processes(server: &RedisServer, extra: &[&str]) -> (Vec<u64>, Vec<u64>) {
    let url = server.url();
    let keys = KEYS.to_string();
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args(["count", &url, TASKS, ITERS, &keys, "300"])
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
    let mut conn = server.connection().await;
    let mut counters = Vec::new();
    for k in 0..KEYS {
        let v: Option<u64> = conn.get(format!("counter:{k}")).await.unwrap();
        counters.push(v.unwrap_or(0));
    }
    (acquired, counters)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_overlap() {
    let server = RedisServer::start();
    let (acquired, counters) = run_two_processes(&server, &[]).await;
    assert_eq!(acquired.iter().sum::<u64>(), 2 * 16 * 200);
    assert_eq!(
        counters, acquired,
        "a lost update means two holders overlapped"
    );
}

/// The same with every call its own command (batching off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_overlap_without_batching() {
    let server = RedisServer::start();
    let (acquired, counters) = run_two_processes(&server, &["--no-batching"]).await;
    assert_eq!(acquired.iter().sum::<u64>(), 2 * 16 * 200);
    assert_eq!(
        counters, acquired,
        "a lost update means two holders overlapped"
    );
}

/// The same workload without the lock loses updates: the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_lock_updates_are_lost() {
    let server = RedisServer::start();
    let (acquired, counters) = run_two_processes(&server, &["--no-lock"]).await;
    assert_eq!(acquired.iter().sum::<u64>(), 2 * 16 * 200);
    assert!(
        counters.iter().sum::<u64>() < acquired.iter().sum::<u64>(),
        "expected lost updates without a lock: {counters:?} vs {acquired:?}"
    );
}
