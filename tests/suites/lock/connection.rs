//! The node connection lock-core opens itself: what the URL asks of it (a password, an
//! ACL user, a database), and what happens to the calls on it when the server drops it.

use crate::common;

use std::time::Duration;

use common::{client, eventually};
use lock_core::{Lease, LockClient, LockConfig, LockOptions};
use lock_tests::RedisServer;

/// How many keys database `db` holds.
async fn keys_in(conn: &mut redis::aio::MultiplexedConnection, db: i64) -> usize {
    redis::cmd("SELECT")
        .arg(db)
        .query_async::<()>(conn)
        .await
        .unwrap();
    redis::cmd("DBSIZE").query_async(conn).await.unwrap()
}

#[tokio::test]
async fn the_urls_password_user_and_database_are_used() {
    let server = RedisServer::start();
    let port = server.port();
    // The harness checks a new server without a password: it is set once the server is up
    // (this connection stays signed in).
    let mut admin = server.connection().await;
    redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "s3cret"])
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">apppw", "~*", "&*", "+@all"])
        .query_async::<()>(&mut admin)
        .await
        .unwrap();

    let by_password = LockClient::open(format!("redis://:s3cret@127.0.0.1:{port}/3"))
        .await
        .unwrap();
    let held = by_password.try_lock("in-db-3").await.unwrap();
    assert_eq!(keys_in(&mut admin, 3).await, 1);
    assert_eq!(keys_in(&mut admin, 0).await, 0);
    held.release().await.unwrap();

    let by_user = LockClient::open(format!("redis://app:apppw@127.0.0.1:{port}/5"))
        .await
        .unwrap();
    let held = by_user.try_lock("in-db-5").await.unwrap();
    assert_eq!(keys_in(&mut admin, 5).await, 1);
    held.release().await.unwrap();

    for wrong in [
        format!("redis://:wrong@127.0.0.1:{port}"),
        format!("redis://app:wrong@127.0.0.1:{port}"),
    ] {
        let e = LockClient::open(wrong.as_str()).await.unwrap_err();
        assert!(
            e.is_redis() && e.to_string().contains("WRONGPASS"),
            "{wrong}: {e}"
        );
    }
    // No password: nothing to check at open (the server check is refused, as it is on
    // a server whose ACL forbids INFO), and every call is refused.
    let anonymous = LockClient::open(format!("redis://127.0.0.1:{port}"))
        .await
        .unwrap();
    let e = anonymous.try_lock("k").await.unwrap_err();
    assert!(e.is_redis() && e.to_string().contains("NOAUTH"), "{e}");
}

/// The server drops the connection while tasks keep taking and releasing locks on it:
/// each call on it answers at once (granted, or a connection error, never a wait for
/// its time limit), and the calls after it connect again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_a_dropped_connection_answer_and_the_next_ones_reconnect() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    let server = RedisServer::start();
    let config = LockConfig::new()
        .with_command_timeout(Duration::from_secs(30))
        .with_watchdog_lease(Duration::from_secs(1));
    let c = client(&server, config).await;
    let mut admin = server.connection().await;
    let mut cut_short = 0;
    for round in 0..5 {
        let cycles = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (c, cycles, stop) = (c.clone(), cycles.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut errors = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("k{round}-{i}");
                        let cycle = match c.try_lock(&name).await {
                            Ok(g) => g.release().await.map(|_| ()),
                            Err(e) => Err(e),
                        };
                        if let Err(e) = cycle {
                            errors.push(e);
                        }
                        cycles.fetch_add(1, Ordering::Relaxed);
                    }
                    errors
                })
            })
            .collect();
        eventually(Duration::from_secs(10), "cycles under way", || async {
            cycles.load(Ordering::Relaxed) >= 200
        })
        .await;
        let killed: i64 = redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
            .query_async(&mut admin)
            .await
            .unwrap();
        assert_eq!(killed, 1, "round {round}: the client's one connection");
        let at_kill = cycles.load(Ordering::Relaxed);
        eventually(Duration::from_secs(10), "cycles after the kill", || async {
            cycles.load(Ordering::Relaxed) >= at_kill + 200
        })
        .await;
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            for e in task.await.unwrap() {
                // A lock whose release or grant was cut short is given back in the
                // background: until then its name is busy.
                if e.is_busy() {
                    continue;
                }
                // A connection error, not a wait for the 30 s time limit.
                assert!(e.is_redis() && !e.is_timeout(), "round {round}: {e}");
                cut_short += 1;
            }
        }
    }
    assert!(
        cut_short > 0,
        "no call was on the connection when it dropped"
    );
    // A lock whose release or grant was cut short is given back in the background
    // or runs out its short lease: none is left held.
    let admin = tokio::sync::Mutex::new(admin);
    eventually(Duration::from_secs(5), "every lock key gone", || async {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut *admin.lock().await)
            .await
            .unwrap();
        keys.is_empty()
    })
    .await;
}

/// A release whose call fails (the connection breaks with it on the wire: Redis never
/// sees it) answers the error, and is sent again in the background: the lock is free
/// long before its lease would end, for this client and for others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_is_tried_again_in_the_background() {
    let server = RedisServer::start();
    let (proxy, c) = common::client_through_proxy(&server).await;
    let other = client(&server, LockConfig::new()).await;
    common::load_scripts(&c).await;
    let a_minute = LockOptions::new().lease(Lease::Fixed(Duration::from_secs(60)));
    let g = c.acquire("cut-release", a_minute).await.unwrap();
    let key = g.keys().key.clone();
    proxy.reset_request(|chunk| chunk.windows(11).any(|w| w == b"cut-release"));
    let err = g.release().await.unwrap_err();
    assert!(err.is_redis() && !err.is_lost(), "{err}");
    eventually(Duration::from_secs(5), "the lock given back", || async {
        !common::exists(&server, &key).await
    })
    .await;
    other
        .try_lock("cut-release")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    c.try_lock("cut-release")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_unix_socket_url_connects() {
    let dir = std::env::temp_dir().join(format!("lock-tests-unix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let socket_arg = socket.to_str().unwrap();
    let server =
        RedisServer::start_with_args(&["--unixsocket", socket_arg, "--unixsocketperm", "700"]);
    let c = LockClient::open(format!("redis+unix://{socket_arg}"))
        .await
        .unwrap();
    let held = c.try_lock("over-a-socket").await.unwrap();
    let mut admin = server.connection().await;
    assert_eq!(keys_in(&mut admin, 0).await, 1);
    held.release().await.unwrap();
    assert_eq!(keys_in(&mut admin, 0).await, 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The path to Redis goes silent for the connection in use while a new connection gets
/// through (a stale NAT entry, an address failed over): once no reply has come for twice
/// the command timeout while replies were owed, the connection is dropped and the next
/// call opens a new one, instead of timing out until TCP gives up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_gone_silent_is_replaced() {
    let server = RedisServer::start();
    let proxy = lock_tests::TcpProxy::start(server.port());
    let config = LockConfig::new().with_command_timeout(Duration::from_millis(200));
    let client = LockClient::open_with_config(proxy.url(), config)
        .await
        .unwrap();
    client
        .try_lock("before")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.strand();
    let started = std::time::Instant::now();
    let mut timeouts = 0;
    let guard = loop {
        match client.try_lock("after").await {
            Ok(guard) => break guard,
            Err(e) => {
                assert!(e.is_unavailable(), "{e}");
                timeouts += 1;
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "still failing after {timeouts} calls: {e}"
                );
            }
        }
    };
    assert!(timeouts >= 1, "the stranded connection answered");
    guard.release().await.unwrap();
}

/// A user whose ACL grants every key and command but no channel (Redis 7's default for
/// a new user, `acl-pubsub-default resetchannels`): a release that frees a lock someone
/// waits for answers that it did, and the waiter gets the lock on its backoff, though
/// no release message can be sent or heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_channels_releases_a_waited_for_lock_cleanly() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "app",
            "on",
            ">apppw",
            "resetchannels",
            "~*",
            "+@all",
        ])
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://app:apppw@127.0.0.1:{}/", server.port());
    let (a, b) = (
        LockClient::open(url.as_str()).await.unwrap(),
        LockClient::open(url.as_str()).await.unwrap(),
    );
    let held = a.try_lock("k").await.unwrap();
    let marker = a.keys("k").unwrap().waiters();
    let waiter = tokio::spawn(async move {
        b.acquire("k", LockOptions::new().wait(Duration::from_secs(5)))
            .await
    });
    // The waiter has marked the lock before the release, so the release publishes.
    eventually(Duration::from_secs(5), "the waiter's marker", || {
        let (mut admin, marker) = (admin.clone(), marker.clone());
        async move {
            redis::cmd("EXISTS")
                .arg(marker)
                .query_async::<i64>(&mut admin)
                .await
                .unwrap()
                == 1
        }
    })
    .await;
    assert_eq!(held.release().await.unwrap(), lock_core::Released::Unlocked);
    let got = waiter.await.unwrap().unwrap();
    got.release().await.unwrap();
}
