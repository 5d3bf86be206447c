//! The expiring semaphore: never more permits in use than the limit across processes,
//! a killed holder's permits come back after their lease (and not before), waiters are
//! woken by releases in this and other clients, bad input and expired permits are reported.

#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{client, eventually, script_sha, seen_until_now, subscribers};
use lock_core::{Backoff, LockClient, LockConfig, LockError, Permits, Semaphore, SemaphoreOptions};
use lock_tests::{Monitor, RedisServer};
use tokio::task::JoinHandle;

const LIMIT: u32 = 5;
const TASKS: usize = 20;
const ITERS: usize = 10;

/// Permits a worker task asks for on iteration `i` (as `semaphore-worker count` does).
fn permits_asked(t: usize, i: usize) -> u64 {
    if (t + i).is_multiple_of(3) { 2 } else { 1 }
}

/// A client whose fallback backoff is so slow that only a wake-up explains a quick grant.
async fn slow_client(server: &RedisServer) -> LockClient {
    let slow = Backoff {
        initial: Duration::from_secs(60),
        max: Duration::from_secs(60),
    };
    client(server, LockConfig::new().with_backoff(slow)).await
}

fn waiting(wait_s: u64) -> SemaphoreOptions {
    SemaphoreOptions::new()
        .lease(Duration::from_secs(120))
        .wait(Duration::from_secs(wait_s))
}

/// Starts a waiter for `n` permits of `sem`, and returns once it sleeps: once
/// `monitor`, skipped to the commands sent up to this call, has seen the waiter's
/// attempt and its retry after subscribing.
async fn asleep(
    server: &RedisServer,
    monitor: &mut Monitor,
    sem: &Semaphore,
    n: u32,
) -> JoinHandle<Result<Permits, LockError>> {
    seen_until_now(server, monitor).await;
    let waiter = {
        let s = sem.clone();
        tokio::spawn(async move { s.acquire(n, waiting(120)).await })
    };
    let acquire_sha = script_sha("semaphore_acquire.lua");
    monitor
        .wait_for_times(&acquire_sha, 2, Duration::from_secs(5))
        .await
        .expect("the waiter's attempt, and its retry");
    waiter
}

async fn available(sem: &Semaphore) -> u32 {
    sem.available().await.expect("available")
}

async fn zcard(server: &RedisServer, key: &str) -> i64 {
    let mut raw = server.connection().await;
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut raw)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_exceed_the_limit() {
    let server = RedisServer::start();
    let url = server.url();
    let (limit, tasks, iters) = (LIMIT.to_string(), TASKS.to_string(), ITERS.to_string());
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_semaphore-worker"))
            .args(["count", &url, "checkout", &limit, &tasks, &iters, "2000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn semaphore-worker")
    };
    let workers = [spawn(), spawn()];
    let (mut acquisitions, mut permits, mut max_in_use, mut short) = (0u64, 0u64, 0i64, 0u64);
    for w in workers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output())
            .await
            .unwrap()
            .expect("worker output");
        assert!(out.status.success(), "worker failed: {:?}", out.status);
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<i64> = text
            .lines()
            .find_map(|l| l.strip_prefix("done "))
            .unwrap_or_else(|| panic!("no result line in {text:?}"))
            .split(' ')
            .map(|f| f.parse().unwrap())
            .collect();
        acquisitions += fields[0] as u64;
        permits += fields[1] as u64;
        max_in_use = max_in_use.max(fields[2]);
        short += fields[3] as u64;
    }
    let expected_permits: u64 = (0..TASKS)
        .flat_map(|t| (0..ITERS).map(move |i| permits_asked(t, i)))
        .sum::<u64>()
        * 2;
    assert_eq!(acquisitions, 2 * (TASKS * ITERS) as u64);
    assert_eq!(permits, expected_permits);
    assert!(
        max_in_use <= i64::from(LIMIT),
        "{max_in_use} permits were in use at once; the limit is {LIMIT}"
    );
    assert!(
        max_in_use >= 2,
        "the semaphore let only one holder in at a time"
    );
    assert_eq!(short, 0, "no permit expired while held (10 s lease)");

    let c = client(&server, LockConfig::new()).await;
    let sem = c.semaphore("checkout", LIMIT).unwrap();
    assert_eq!(available(&sem).await, LIMIT, "every permit was given back");
    assert_eq!(zcard(&server, sem.key()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holders_permits_come_back_after_the_lease_and_not_before() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let sem = c.semaphore("printer", 3).unwrap();
    let lease_ms = 2_000u64;
    let mut worker = Command::new(env!("CARGO_BIN_EXE_semaphore-worker"))
        .args([
            "hold",
            &server.url(),
            "printer",
            "3",
            "3",
            &lease_ms.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn semaphore-worker");
    let mut line = String::new();
    BufReader::new(worker.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ids: Vec<String> = line
        .trim()
        .strip_prefix("held ")
        .unwrap_or_else(|| panic!("unexpected worker output {line:?}"))
        .split(' ')
        .map(str::to_owned)
        .collect();
    assert_eq!(ids.len(), 3);

    worker.kill().expect("SIGKILL the holder");
    worker.wait().unwrap();

    // Right after the kill the permits are still taken: nothing gave them back.
    let e = sem.try_acquire(1).await.unwrap_err();
    assert!(e.is_busy(), "{e}");
    match e {
        lock_core::LockError::Busy { key, retry_after } => {
            assert_eq!(key, sem.name());
            assert!(
                retry_after > Duration::ZERO && retry_after <= Duration::from_millis(lease_ms),
                "{retry_after:?}"
            );
        }
        other => panic!("{other}"),
    }
    assert_eq!(available(&sem).await, 0);

    eventually(
        Duration::from_secs(10),
        "the killed holder's permits to expire",
        || async { available(&sem).await == 3 },
    )
    .await;
    // Counting only reads (it runs on a full server): the next acquisition removes the
    // expired permits, if the key's own expiry has not already taken them.
    let all = sem.try_acquire(3).await.unwrap();
    let mut raw = server.connection().await;
    for id in &ids {
        let score: Option<f64> = redis::cmd("ZSCORE")
            .arg(sem.key())
            .arg(id)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert_eq!(score, None, "expired permit {id} is gone");
    }
    assert_eq!(all.release().await.unwrap(), 3);
}

/// A waiter sleeping on its (60 s) backoff is woken promptly by a release in another
/// client (through pub/sub) and by a release in its own client (locally: a client ignores
/// its own release messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_wake_waiters_in_other_clients_and_locally() {
    let server = RedisServer::start();
    let a = slow_client(&server).await;
    let b = slow_client(&server).await;
    let sem_a = a.semaphore("dock", 1).unwrap();
    let sem_b = b.semaphore("dock", 1).unwrap();
    // Also loads the script, so each attempt below is one EVALSHA.
    let held_by_a = sem_a.try_acquire(1).await.unwrap();

    // Another client releases: pub/sub wakes the waiter.
    let mut monitor = server.monitor().await;
    let waiter = asleep(&server, &mut monitor, &sem_b, 1).await;
    assert_eq!(held_by_a.release().await.unwrap(), 1);
    eventually(
        Duration::from_secs(3),
        "the waiter woken by the other client's release",
        || async { waiter.is_finished() },
    )
    .await;
    let held_by_b = waiter.await.unwrap().unwrap();

    // The same client releases: the local wake-up.
    let waiter = asleep(&server, &mut monitor, &sem_b, 1).await;
    assert_eq!(held_by_b.release().await.unwrap(), 1);
    eventually(
        Duration::from_secs(3),
        "the waiter woken by its own client's release",
        || async { waiter.is_finished() },
    )
    .await;
    let last = waiter.await.unwrap().unwrap();
    assert_eq!(last.release().await.unwrap(), 1);
    assert_eq!(available(&sem_a).await, 1);
}

/// One message for three permits: the first waiter woken passes the turn on, so all
/// three waiters of the other client get in without their slow backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_of_many_permits_wakes_as_many_waiters() {
    let server = RedisServer::start();
    let holder = client(&server, LockConfig::new()).await;
    let others = slow_client(&server).await;
    let sem = holder.semaphore("gate", 3).unwrap();
    let all = sem.try_acquire(3).await.unwrap();
    let their_sem = others.semaphore("gate", 3).unwrap();
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let s = their_sem.clone();
            tokio::spawn(async move { s.acquire(1, waiting(120)).await })
        })
        .collect();
    eventually(
        Duration::from_secs(5),
        "the waiters' subscription",
        || async { subscribers(&server, sem.channel()).await == 1 },
    )
    .await;
    assert_eq!(all.release().await.unwrap(), 3);
    eventually(Duration::from_secs(3), "all three waiters", || async {
        waiters.iter().all(|w| w.is_finished())
    })
    .await;
    for w in waiters {
        let p = w.await.unwrap().unwrap();
        assert_eq!(p.len(), 1);
        drop(p);
    }
    eventually(
        Duration::from_secs(2),
        "dropped permits released",
        || async { available(&sem).await == 3 },
    )
    .await;
}

/// A waiter woken by a release that frees too few permits for it passes the turn on:
/// a smaller waiter of the same client, asleep behind it, gets the freed permit without
/// its slow backoff (with two permits wanted and one free, the bigger one waits on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_needs_more_passes_a_release_on_to_one_that_fits() {
    let server = RedisServer::start();
    let holder = client(&server, LockConfig::new()).await;
    let others = slow_client(&server).await;
    let sem = holder.semaphore("mixed", 2).unwrap();
    let theirs = others.semaphore("mixed", 2).unwrap();
    let one = sem.try_acquire(1).await.unwrap();
    let _other = sem.try_acquire(1).await.unwrap();
    let mut monitor = server.monitor().await;
    // The bigger waiter first: the oldest asleep, it is the one a release wakes.
    let big = asleep(&server, &mut monitor, &theirs, 2).await;
    let small = asleep(&server, &mut monitor, &theirs, 1).await;
    assert_eq!(one.release().await.unwrap(), 1);
    eventually(
        Duration::from_secs(3),
        "the small waiter to get the freed permit",
        || async { small.is_finished() },
    )
    .await;
    let got = small.await.unwrap().unwrap();
    assert!(
        !big.is_finished(),
        "one permit free: the big waiter waits on"
    );
    big.abort();
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_an_error_before_redis() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;

    let e = c.semaphore("pool", 0).unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("at least one permit"),
        "{e}"
    );
    let e = c.semaphore("", 3).unwrap_err();
    assert!(matches!(e, lock_core::LockError::InvalidKey(_)), "{e}");

    let sem = c.semaphore("pool", 3).unwrap();
    let e = sem.try_acquire(0).await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("0 permits"),
        "{e}"
    );
    let e = sem.try_acquire(4).await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("only 3"),
        "{e}"
    );
    for lease in [
        Duration::ZERO,
        Duration::from_millis(1),
        Duration::from_secs(365 * 24 * 3600),
    ] {
        let e = sem
            .acquire(1, SemaphoreOptions::new().lease(lease))
            .await
            .unwrap_err();
        assert!(
            e.is_invalid_input() && e.to_string().contains("lease"),
            "{e}"
        );
    }
    let big = c.semaphore("big", 1_000_000).unwrap();
    let e = big.try_acquire(5_000).await.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("1024"),
        "{e}"
    );

    let p = sem.try_acquire(1).await.unwrap();
    let e = p.extend(Duration::ZERO).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert_eq!(p.release().await.unwrap(), 1);

    let mut raw = server.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(keys.is_empty(), "refused calls wrote {keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_permits_are_reported_on_release_and_extend() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let sem = c.semaphore("tickets", 2).unwrap();

    let p = sem
        .acquire(2, SemaphoreOptions::new().lease(Duration::from_millis(50)))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(3),
        "the short lease to pass",
        || async { available(&sem).await == 2 },
    )
    .await;
    assert_eq!(p.valid_for(), Duration::ZERO);
    assert_eq!(p.extend(Duration::from_secs(5)).await.unwrap(), 0);
    assert_eq!(available(&sem).await, 2, "extend never revives a permit");
    assert_eq!(p.release().await.unwrap(), 0, "both had expired");

    // One of two permits vanishes (as its lease would): release reports the other.
    let q = sem.try_acquire(2).await.unwrap();
    let mut raw = server.connection().await;
    let removed: i64 = redis::cmd("ZREM")
        .arg(sem.key())
        .arg(&q.ids()[0])
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(q.release().await.unwrap(), 1);
    assert_eq!(available(&sem).await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_moves_the_expiry_on_the_server_clock() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let sem = c.semaphore("lane", 1).unwrap();
    let p = sem
        .acquire(1, SemaphoreOptions::new().lease(Duration::from_millis(300)))
        .await
        .unwrap();
    let mut raw = server.connection().await;
    let mut score = redis::cmd("ZSCORE");
    score.arg(sem.key()).arg(&p.ids()[0]);
    let before: f64 = score.query_async(&mut raw).await.unwrap();
    assert_eq!(p.extend(Duration::from_secs(10)).await.unwrap(), 1);
    let after: f64 = score.query_async(&mut raw).await.unwrap();
    assert!(after >= before + 9_700.0, "{before} -> {after}");
    let pttl: i64 = redis::cmd("PTTL")
        .arg(sem.key())
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > 5_000, "the set's own expiry follows: {pttl}");
    assert!(p.valid_for() > Duration::from_secs(5));
    assert!(sem.try_acquire(1).await.unwrap_err().is_busy());
    assert_eq!(p.release().await.unwrap(), 1);
}

/// Timeouts, dropped permits and a cancelled waiter leave nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_drops_and_cancellation_clean_up() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let sem = c.semaphore("room", 2).unwrap();
    let held = sem.try_acquire(2).await.unwrap();

    let e = sem
        .acquire(1, SemaphoreOptions::new().wait(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(
        matches!(&e, lock_core::LockError::Timeout { key, .. } if key == sem.name()),
        "{e:?}"
    );

    let cancelled =
        tokio::time::timeout(Duration::from_millis(200), sem.acquire(1, waiting(120))).await;
    assert!(cancelled.is_err(), "still waiting when cancelled");
    eventually(
        Duration::from_secs(2),
        "the cancelled waiter's subscription to go",
        || async { subscribers(&server, sem.channel()).await == 0 },
    )
    .await;

    drop(held);
    eventually(
        Duration::from_secs(2),
        "dropped permits released",
        || async { available(&sem).await == 2 },
    )
    .await;
    assert_eq!(zcard(&server, sem.key()).await, 0);
}

/// A release whose call fails (the connection breaks with it on the wire: Redis never
/// sees it) answers the error, and is sent again in the background, as a lock's is: the
/// permits come back long before their lease would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_is_tried_again_in_the_background() {
    let server = RedisServer::start();
    let (proxy, c) = common::client_through_proxy(&server).await;
    let sem = c.semaphore("cut-permits", 2).unwrap();
    let minute = SemaphoreOptions::new().lease(Duration::from_secs(60));
    // A first cycle loads the scripts, so the release is one call.
    sem.acquire(1, minute)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = sem.acquire(2, minute).await.unwrap();
    assert_eq!(zcard(&server, sem.key()).await, 2);
    proxy.reset_request(|chunk| chunk.windows(11).any(|w| w == b"cut-permits"));
    let err = held.release().await.unwrap_err();
    assert!(err.is_redis(), "{err}");
    eventually(Duration::from_secs(5), "the permits given back", || async {
        zcard(&server, sem.key()).await == 0
    })
    .await;
    assert_eq!(available(&sem).await, 2);
}
