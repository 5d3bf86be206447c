//! Lost locks and fencing: a holder that cannot renew past its lease learns it lost the
//! lock, its fenced write is refused, the new holder's is accepted, and its release says
//! what happened. `lost()` fires on the client's own timer when the server stops
//! answering or a partition cuts the holder off, and a grant that arrives with no
//! validity left is given back at once.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, eventually, exists, pttl};
use lock_core::{FencedWrite, Lease, LockClient, LockConfig, LockError, LockOptions};
use lock_tests::{RedisServer, TcpProxy};

fn fixed(ms: u64) -> LockOptions {
    LockOptions::new().lease(Lease::Fixed(Duration::from_millis(ms)))
}

/// A proxy in front of `server`, and a client through it whose watchdog lease is
/// 600 ms, with calls limited to `command_timeout`.
async fn watched_through_proxy(
    server: &RedisServer,
    command_timeout: Duration,
) -> (TcpProxy, LockClient) {
    let proxy = TcpProxy::start(server.port());
    let config = LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(600))
        .with_command_timeout(command_timeout);
    let client = LockClient::open_with_config(proxy.url().as_str(), config)
        .await
        .unwrap();
    (proxy, client)
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

/// A short fixed lease taken after long ones were released is lost at its own end, not
/// at theirs: lost() fires, the guard stops believing, and the client stops counting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_lease_after_long_ones_were_released_is_lost_on_time() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    for _ in 0..3 {
        let long = a.acquire("long", fixed(60_000)).await.unwrap();
        long.release().await.unwrap();
    }
    let short = a.acquire("short", fixed(300)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(3), short.lost())
        .await
        .expect("lost() fires once the short lease has run out");
    assert!(!short.is_held());
    eventually(
        Duration::from_secs(3),
        "the lease clock to end the hold, not a minute later",
        || async { a.held_count() == 0 },
    )
    .await;
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

/// The holder's Redis stops answering (paused): `lost()` fires at the end of the
/// lease the client can prove, on its own timer, not after the renewal call gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_on_time_when_redis_stops_answering() {
    let server = RedisServer::start();
    let lease = Duration::from_millis(500);
    let config = LockConfig::new()
        .with_watchdog_lease(lease)
        .with_command_timeout(Duration::from_secs(5));
    let period = config.watchdog_period();
    let a = client(&server, config).await;
    let g = a.lock("paused").await.unwrap();
    // Let a renewal or two happen.
    tokio::time::sleep(period * 2).await;
    assert!(g.is_held());
    let promised = g.valid_for();
    server.pause();
    let paused_at = Instant::now();
    tokio::time::timeout(lease + period, g.lost())
        .await
        .expect("lost() must fire within a lease and a renewal period of the pause");
    let fired = paused_at.elapsed();
    assert!(
        fired + Duration::from_millis(20) >= promised,
        "lost() fired after {fired:?}, before the {promised:?} the guard promised"
    );
    assert!(!g.is_held());
    assert!(g.valid_for().is_zero());
    server.resume();
    let key = &g.keys().key;
    // The renewal sent during the pause is answered now, and can find the key still
    // there (Redis counts the lease from a later instant than the client can prove).
    // Wait until Redis took it (the key refreshed, or gone), then ask on the same
    // connection, whose replies come in order: the loss must stay.
    eventually(
        Duration::from_secs(5),
        "the queued renewal answered",
        || async {
            let left = pttl(&server, key).await;
            left == -2 || left > (lease / 2).as_millis() as i64
        },
    )
    .await;
    let _ = a.try_lock("paused-after").await;
    assert!(
        !g.is_held(),
        "a renewal answered after lost() fired revived the grant"
    );
    let released = g.release().await;
    assert!(released.unwrap_err().is_lost());
}

/// An extension that Redis took in time, answered after the lease the client can prove
/// ran out (its reply held in the network while `lost()` fired): the grant stays lost, and
/// its extension and release say so. A loss is final.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_answered_after_the_lease_ran_out_does_not_revive_the_grant() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let config = LockConfig::new().with_command_timeout(Duration::from_secs(10));
    let a = LockClient::open_with_config(proxy.url().as_str(), config)
        .await
        .unwrap();
    let g = a.acquire("late-extend", fixed(500)).await.unwrap();
    // Loads the script, so that the held reply is the extension's, not a NOSCRIPT.
    g.extend(Duration::from_millis(500)).await.unwrap();
    proxy.hold_reply_to(|chunk| chunk.windows(11).any(|w| w == b"late-extend"));
    let (extended, ()) = tokio::join!(g.extend(Duration::from_secs(30)), async {
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("lost() fires when the fixed lease runs out");
        // Redis extended the key before the lease ran out; only its answer is late.
        let left = pttl(&server, &g.keys().key).await;
        assert!(
            left > 20_000,
            "the extension was not executed in time: {left}"
        );
        assert!(proxy.is_holding(), "the extension's reply was not held");
        proxy.release_reply();
    });
    let e = extended.expect_err("an extension answered after lost() fired succeeded");
    assert!(e.is_lost(), "{e:?}");
    assert!(!g.is_held(), "the late answer revived the grant");
    assert!(g.release().await.unwrap_err().is_lost());
}

/// The same with the watchdog's lease: the extension's answer is held, so the renewals
/// queued behind it go unanswered and the watchdog marks the grant lost at the end of
/// its lease. The extension answered afterwards reports the loss instead of succeeding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_answered_after_the_watchdog_marked_the_grant_lost_fails() {
    let server = RedisServer::start();
    let (proxy, a) = watched_through_proxy(&server, Duration::from_secs(10)).await;
    let g = a.lock("late-watched").await.unwrap();
    g.extend(Duration::from_millis(600)).await.unwrap();
    // The extension alone asks for 45 s (renewals ask for the 600 ms lease).
    proxy.hold_reply_to(|chunk| chunk.windows(5).any(|w| w == b"45000"));
    let (extended, ()) = tokio::join!(g.extend(Duration::from_secs(45)), async {
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("the watchdog marks the grant lost when its renewals go unanswered");
        let left = pttl(&server, &g.keys().key).await;
        assert!(left > 30_000, "the extension was not executed: {left}");
        assert!(proxy.is_holding(), "the extension's reply was not held");
        proxy.release_reply();
    });
    let e = extended.expect_err("an extension answered after the grant was lost succeeded");
    assert!(e.is_lost(), "{e:?}");
    assert!(!g.is_held());
}

/// A grant reported lost whose release gets no answer (the holder is still cut off)
/// returns the loss, as its release does when the store answers; the release is sent
/// again once the store is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_grant_released_while_cut_off_returns_the_loss() {
    let server = RedisServer::start();
    let (proxy, a) = watched_through_proxy(&server, Duration::from_millis(500)).await;
    let g = a.lock("cut-release").await.unwrap();
    let key = g.keys().key.clone();
    proxy.cut();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fires while cut off");
    let e = g.release().await.unwrap_err();
    assert!(e.is_lost(), "the release of a lost grant returned {e:?}");
    proxy.heal();
    eventually(Duration::from_secs(5), "the lock key gone", || async {
        !exists(&server, &key).await
    })
    .await;
}

/// A real partition: a proxy stops forwarding without closing. The
/// cut-off holder's `lost()` fires within lease + one renewal period; a second holder
/// takes over, and the first one's fenced write after the second's is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitioned_holder_learns_it_lost_and_its_fenced_write_is_refused() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let lease = Duration::from_millis(600);
    let config = LockConfig::new()
        .with_watchdog_lease(lease)
        .with_command_timeout(Duration::from_secs(5));
    let period = config.watchdog_period();
    let cut_off = LockClient::open_with_config(proxy.url().as_str(), config.clone())
        .await
        .unwrap();
    let other = client(&server, config).await;
    let first = cut_off.lock("ledger").await.unwrap();
    let first_token = first.fence().await.unwrap();
    assert_eq!(
        cut_off
            .fenced_write("ledger", first_token, "a0")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    proxy.cut();
    let cut_at = Instant::now();
    tokio::time::timeout(lease + period, first.lost())
        .await
        .expect("lost() within lease + one renewal period of the cut");
    assert!(!first.is_held());
    let second = other
        .acquire("ledger", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(cut_at.elapsed() >= lease.saturating_sub(Duration::from_millis(50)));
    let second_token = second.fence().await.unwrap();
    assert!(second_token > first_token);
    assert_eq!(
        other
            .fenced_write("ledger", second_token, "b")
            .await
            .unwrap(),
        FencedWrite::Written
    );
    proxy.heal();
    // The stale holder writes late: refused.
    let late = cut_off
        .fenced_write("ledger", first_token, "a1")
        .await
        .unwrap();
    assert!(
        matches!(late, FencedWrite::Refused { highest } if highest.get() == second_token.get())
    );
    assert_eq!(
        other.fenced_read("ledger").await.unwrap().as_deref(),
        Some(&b"b"[..])
    );
    assert!(first.release().await.unwrap_err().is_not_owner());
    second.release().await.unwrap();
}

/// A grant whose reply arrives after its lease (the request sat in a paused
/// server) is given back at once instead of blocking everyone for a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_with_no_validity_left_is_given_back_at_once() {
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    // Load the scripts first, so the queued call grants rather than gets NOSCRIPT.
    a.try_lock("warm").await.unwrap().release().await.unwrap();
    let key = a.keys("late").unwrap().key;
    server.pause();
    let attempt = {
        let a = a.clone();
        tokio::spawn(async move {
            a.acquire(
                "late",
                LockOptions::new()
                    .wait(Duration::ZERO)
                    .lease(Lease::Fixed(Duration::from_millis(300))),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.resume();
    let resumed = Instant::now();
    let outcome = attempt.await.unwrap();
    // Said as it is: the lock was free, but the grant came too late to be used.
    match outcome.unwrap_err() {
        LockError::ValidityExhausted {
            key: name,
            elapsed,
            lease,
        } => {
            assert_eq!(name, "late");
            assert_eq!(lease, Duration::from_millis(300));
            assert!(elapsed >= lease, "took {elapsed:?}");
        }
        other => panic!("no usable grant, but: {other}"),
    }
    // Gone well before the 300 ms the server granted from its resumption.
    assert!(!exists(&server, &key).await);
    assert!(resumed.elapsed() < Duration::from_millis(250));
    let b = client(&server, LockConfig::new()).await;
    b.try_lock("late").await.unwrap().release().await.unwrap();
}
