//! Lost locks and fencing: a holder that cannot renew past its lease learns it lost the
//! lock, its fenced write is refused, the new holder's is accepted, and its release says
//! what happened.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{client, eventually, exists};
use lock_core::{FencedWrite, Lease, LockConfig, LockOptions};
use lock_tests::RedisServer;

fn fixed(ms: u64) -> LockOptions {
    LockOptions::new().lease(Lease::Fixed(Duration::from_millis(ms)))
}

/// Renewal disabled (a fixed lease): the lease passes, another client takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_lease_runs_out_and_the_stale_holder_is_fenced() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let b = client(&server, LockConfig::new()).await;

    let first = a.acquire("ledger", fixed(300).fenced()).await.unwrap();
    assert!(first.is_held());
    let second = b
        .acquire("ledger", fixed(5_000).wait(Duration::from_secs(3)).fenced())
        .await
        .unwrap();
    assert!(second.fencing_token() > first.fencing_token());

    tokio::time::timeout(Duration::from_secs(1), first.lost())
        .await
        .expect("lost() fires once the lease has run out");
    assert!(!first.is_held());
    assert_eq!(first.valid_for(), Duration::ZERO);

    let newer = b
        .fenced_write("ledger", second.fencing_token().unwrap(), "b")
        .await
        .unwrap();
    assert_eq!(newer, FencedWrite::Written);
    let stale = a
        .fenced_write("ledger", first.fencing_token().unwrap(), "a")
        .await
        .unwrap();
    assert_eq!(
        stale,
        FencedWrite::Refused {
            highest: second.fencing_token().unwrap()
        }
    );
    assert_eq!(
        b.fenced_read("ledger").await.unwrap().as_deref(),
        Some(&b"b"[..])
    );

    let e = first.release().await.unwrap_err();
    assert!(e.is_not_owner(), "{e}");
    // The stale release did not free the new holder's lock.
    assert!(second.is_held());
    assert!(a.try_lock("ledger").await.unwrap_err().is_busy());
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_expiry_reports_expired() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let g = a.acquire("short", fixed(50)).await.unwrap();
    let lock_key = a.keys("short").unwrap().key;
    eventually(Duration::from_secs(2), "lease expiry", || async {
        !exists(&server, &lock_key).await
    })
    .await;
    let e = g.release().await.unwrap_err();
    assert!(e.is_expired(), "{e}");
}

/// The watchdog's renewal is refused (the lock was taken over, as after a failover
/// that lost the key): lost() fires, extend and release say not-owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_renewal_fires_lost() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let a = client(&server, config.clone()).await;
    let b = client(&server, config).await;
    let g = a.try_lock("job").await.unwrap();
    let lock_key = a.keys("job").unwrap().key;
    // Simulate the key vanishing (failover to a replica that never saw it).
    let mut raw = server.connection().await;
    let _: () = redis::cmd("DEL")
        .arg(&lock_key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let g2 = b.try_lock("job").await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), g.lost())
        .await
        .expect("the next renewal finds another owner");
    assert!(!g.is_held());
    assert!(
        g.extend(Duration::from_secs(1))
            .await
            .unwrap_err()
            .is_lost()
    );
    assert!(g.release().await.unwrap_err().is_not_owner());
    assert!(g2.is_held());
    g2.release().await.unwrap();
}

/// The holder's whole process is paused (SIGSTOP) past its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_holder_process_loses_the_lock() {
    let server = RedisServer::start();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_lock-worker"))
        .args(["hold", &server.url(), "vault", "600"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn lock-worker");
    let mut out = BufReader::new(worker.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let worker_token: u64 = line
        .trim()
        .strip_prefix("token ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("unexpected worker output {line:?}"));
    let pid = worker.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    };

    let b = client(&server, LockConfig::new()).await;
    let lock_key = b.keys("vault").unwrap().key;
    signal("-STOP");
    eventually(
        Duration::from_secs(5),
        "the paused holder's lease to run out",
        || async { !exists(&server, &lock_key).await },
    )
    .await;
    let g = b.try_lock("vault").await.unwrap();
    let token = g.fence().await.unwrap();
    assert!(token.get() > worker_token);
    assert_eq!(
        b.fenced_write("vault", token, "from-b").await.unwrap(),
        FencedWrite::Written
    );
    signal("-CONT");
    worker.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    let status = worker.wait().unwrap();
    assert!(status.success());
    assert_eq!(
        line.trim(),
        format!("report held=false lost=true write=refused-by-{token} release=not-owner",)
    );
    assert!(g.is_held());
    g.release().await.unwrap();
}
