//! Self-test of [`TcpProxy`]: it forwards faithfully, `cut` partitions
//! silently (requests hang, connections stay open, bytes are held), `strand`
//! does so for the connections open then only,
//! `heal` delivers what was held, dropping it closes everything, and a
//! single reply can be lost (reset), held until released, or followed by a partition.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lock_tests::{RedisServer, TcpProxy, free_port};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::timeout;

/// How long a partitioned request is given to (wrongly) come back.
const HANG: Duration = Duration::from_millis(300);
/// Upper bound for anything that should happen promptly.
const PROMPTLY: Duration = Duration::from_secs(5);

/// A multiplexed connection through the proxy, with the generous timeouts of
/// [`lock_tests::connect`].
async fn connect(proxy: &TcpProxy) -> MultiplexedConnection {
    lock_tests::connect(&proxy.client())
        .await
        .unwrap_or_else(|e| panic!("cannot connect through {proxy:?}: {e}"))
}

async fn ping(conn: &mut MultiplexedConnection) -> redis::RedisResult<String> {
    redis::cmd("PING").query_async(conn).await
}

/// `connected_clients` from `INFO clients`, as the server counts them.
async fn connected_clients(conn: &mut MultiplexedConnection) -> usize {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connected_clients in {info:?}"))
}

/// Polls `connected_clients` until it equals `want`.
async fn await_connected_clients(conn: &mut MultiplexedConnection, want: usize) {
    let deadline = Instant::now() + PROMPTLY;
    loop {
        let got = connected_clients(conn).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "connected_clients stayed {got}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_go_through_the_proxy() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.target_port(), server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    assert!(!proxy.is_cut());

    let mut conn = connect(&proxy).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    let () = conn.set("k", "through the proxy").await.unwrap();
    let mut direct = server.connection().await;
    let value: String = direct.get("k").await.unwrap();
    assert_eq!(value, "through the proxy");

    // Large values cross intact, in both directions.
    let big: Vec<u8> = (0..4 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let () = conn.set("big", &big).await.unwrap();
    let back: Vec<u8> = conn.get("big").await.unwrap();
    assert!(back == big, "the 4 MiB value came back altered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_hangs_without_closing_and_heal_delivers() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut conn = connect(&proxy).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    let mut direct = server.connection().await;

    proxy.cut();
    assert!(proxy.is_cut());
    let hung = timeout(HANG, ping(&mut conn)).await;
    assert!(hung.is_err(), "a PING crossed a cut proxy: {hung:?}");

    // A write sent while cut is held, not executed (and not dropped).
    let mut writer = conn.clone();
    let held_set = tokio::spawn(async move { writer.set::<_, _, ()>("k", "v").await });
    tokio::time::sleep(HANG).await;
    assert!(!held_set.is_finished(), "SET answered through a cut proxy");
    let exists: bool = direct.exists("k").await.unwrap();
    assert!(!exists, "a SET sent while cut reached the server");

    // The server itself is fine; only this client is partitioned.
    assert_eq!(ping(&mut direct).await.unwrap(), "PONG");

    proxy.heal();
    assert!(!proxy.is_cut());
    timeout(PROMPTLY, held_set)
        .await
        .expect("the held SET is answered after heal")
        .unwrap()
        .expect("the held SET succeeds: its connection was never closed");
    let value: String = direct.get("k").await.unwrap();
    assert_eq!(value, "v");
    // The same connection carries on.
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    let value: String = conn.get("k").await.unwrap();
    assert_eq!(value, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_reaches_the_server_once_cut_returns() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut direct = server.connection().await;
    let mut conn = connect(&proxy).await;

    // One client hammering INCR, each awaited, through the proxy.
    let stop = Arc::new(AtomicBool::new(false));
    let hammer = tokio::spawn({
        let stop = Arc::clone(&stop);
        async move {
            let mut sent = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let _: u64 = conn.incr("counter", 1).await.unwrap();
                sent += 1;
            }
            sent
        }
    });
    let started = Instant::now();
    while direct.get::<_, Option<u64>>("counter").await.unwrap() < Some(100) {
        assert!(started.elapsed() < PROMPTLY, "the INCRs do not get through");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    for round in 0..3 {
        proxy.cut();
        // Let the server execute what it had received before the cut.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before: u64 = direct.get("counter").await.unwrap();
        tokio::time::sleep(HANG).await;
        let after: u64 = direct.get("counter").await.unwrap();
        assert_eq!(before, after, "round {round}: INCRs crossed a cut proxy");

        proxy.heal();
        let started = Instant::now();
        while direct.get::<_, u64>("counter").await.unwrap() < after + 10 {
            assert!(
                started.elapsed() < PROMPTLY,
                "round {round}: the INCRs do not resume after heal"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    stop.store(true, Ordering::SeqCst);
    let sent = timeout(PROMPTLY, hammer).await.unwrap().unwrap();
    let counted: u64 = direct.get("counter").await.unwrap();
    assert_eq!(sent, counted, "every INCR was executed exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_made_while_cut_reach_the_server_after_heal() {
    let server = RedisServer::start();
    let proxy = Arc::new(TcpProxy::start(server.port()));
    let mut direct = server.connection().await;
    let clients = connected_clients(&mut direct).await;

    proxy.cut();
    let late = tokio::spawn({
        let proxy = Arc::clone(&proxy);
        async move {
            let mut conn = proxy
                .client()
                .get_multiplexed_async_connection()
                .await
                .expect("connect through the healed proxy");
            ping(&mut conn)
                .await
                .expect("PING through the healed proxy")
        }
    });
    tokio::time::sleep(HANG).await;
    assert!(!late.is_finished(), "a new connection crossed a cut proxy");
    assert_eq!(
        connected_clients(&mut direct).await,
        clients,
        "the server saw a connection made while cut"
    );

    proxy.heal();
    let pong = timeout(PROMPTLY, late).await.unwrap().unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strand_holds_the_open_connections_and_lets_new_ones_through() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut old = connect(&proxy).await;
    assert_eq!(ping(&mut old).await.unwrap(), "PONG");

    proxy.strand();
    let mut writer = old.clone();
    let held_set = tokio::spawn(async move { writer.set::<_, _, ()>("k", "v").await });
    let mut new = connect(&proxy).await;
    assert_eq!(
        ping(&mut new).await.unwrap(),
        "PONG",
        "a new connection gets through"
    );
    tokio::time::sleep(HANG).await;
    assert!(
        !held_set.is_finished(),
        "SET answered on a stranded connection"
    );
    let exists: bool = new.exists("k").await.unwrap();
    assert!(
        !exists,
        "a SET sent on a stranded connection reached the server"
    );

    proxy.heal();
    timeout(PROMPTLY, held_set)
        .await
        .expect("the held SET is answered after heal")
        .unwrap()
        .expect("the held SET succeeds: its connection was never closed");
    let value: String = new.get("k").await.unwrap();
    assert_eq!(value, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_closes_the_connections() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let port = proxy.port();
    let mut direct = server.connection().await;
    let clients = connected_clients(&mut direct).await;
    let mut conn = connect(&proxy).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
    assert_eq!(connected_clients(&mut direct).await, clients + 1);

    drop(proxy);
    let after = timeout(PROMPTLY, ping(&mut conn))
        .await
        .expect("a command on a dropped proxy's connection fails, it does not hang");
    assert!(after.is_err(), "got {after:?} through a dropped proxy");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    // The server side of the connection is closed as well.
    await_connected_clients(&mut direct, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_while_cut_closes_the_connections() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut direct = server.connection().await;
    let clients = connected_clients(&mut direct).await;
    let mut conn = connect(&proxy).await;
    assert_eq!(ping(&mut conn).await.unwrap(), "PONG");

    proxy.cut();
    let mut pending_conn = conn.clone();
    let pending = tokio::spawn(async move { ping(&mut pending_conn).await });
    tokio::time::sleep(HANG).await;
    assert!(!pending.is_finished());

    let dropped = Instant::now();
    drop(proxy);
    assert!(
        dropped.elapsed() < Duration::from_secs(1),
        "dropping a cut proxy took {:?}",
        dropped.elapsed()
    );
    let result = timeout(PROMPTLY, pending)
        .await
        .expect("the pending PING fails once the proxy is dropped, it does not hang")
        .unwrap();
    assert!(result.is_err(), "got {result:?} through a dropped proxy");
    let after = timeout(PROMPTLY, ping(&mut conn)).await.unwrap();
    assert!(after.is_err(), "got {after:?} through a dropped proxy");
    await_connected_clients(&mut direct, clients).await;
}

#[test]
fn a_refused_target_closes_the_client_connection() {
    let proxy = TcpProxy::start(free_port());
    let mut stream = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    stream.set_read_timeout(Some(PROMPTLY)).unwrap();
    let mut buffer = [0; 16];
    match stream.read(&mut buffer) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the connection to be closed, got {other:?}"),
    }
}

#[test]
fn the_proxy_outlives_runtimes() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    for _ in 0..2 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut conn = connect(&proxy).await;
            assert_eq!(ping(&mut conn).await.unwrap(), "PONG");
        });
    }
    proxy.cut();
    proxy.heal();
    drop(proxy);
}

/// A plain TCP connection through `proxy`, for byte-level checks.
fn raw(proxy: &TcpProxy) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(PROMPTLY)).unwrap();
    s
}

/// Sends an inline command and reads what comes back (one read).
fn send(s: &mut TcpStream, command: &str) -> std::io::Result<String> {
    s.write_all(format!("{command}\r\n").as_bytes())?;
    let mut buffer = [0; 64];
    let n = s.read(&mut buffer)?;
    Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_next_reply_loses_one_executed_reply_with_a_reset() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut direct = server.connection().await;
    let clients = connected_clients(&mut direct).await;
    let mut conn = raw(&proxy);
    assert_eq!(send(&mut conn, "PING").unwrap(), "+PONG\r\n");

    proxy.reset_next_reply();
    let lost = send(&mut conn, "SET k v");
    assert!(
        lost.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset instead of the reply, got {lost:?}"
    );
    let value: String = direct.get("k").await.unwrap();
    assert_eq!(value, "v", "the request was executed");
    // Closed toward the server too, and the proxy disarmed itself.
    await_connected_clients(&mut direct, clients).await;
    assert_eq!(send(&mut raw(&proxy), "GET k").unwrap(), "$1\r\nv\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_reply_to_loses_only_the_matching_requests_reply() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut direct = server.connection().await;
    let (mut idle, mut conn) = (raw(&proxy), raw(&proxy));
    proxy.reset_reply_to(|chunk| chunk.starts_with(b"INCR"));
    // Other requests, and other connections, are answered.
    assert_eq!(send(&mut conn, "PING").unwrap(), "+PONG\r\n");
    assert_eq!(send(&mut idle, "PING").unwrap(), "+PONG\r\n");
    let lost = send(&mut conn, "INCR n");
    assert!(
        lost.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset instead of the reply, got {lost:?}"
    );
    assert_eq!(direct.get::<_, u64>("n").await.unwrap(), 1);
    assert_eq!(send(&mut idle, "INCR n").unwrap(), ":2\r\n", "fired once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_reply_to_delivers_the_executed_reply_when_released() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut direct = server.connection().await;
    let (mut idle, mut conn) = (raw(&proxy), raw(&proxy));
    proxy.hold_reply_to(|chunk| chunk.starts_with(b"INCR"));
    assert_eq!(send(&mut conn, "PING").unwrap(), "+PONG\r\n");
    assert!(!proxy.is_holding());
    conn.write_all(b"INCR n\r\nPING\r\n").unwrap();
    let deadline = Instant::now() + PROMPTLY;
    while !proxy.is_holding() {
        assert!(Instant::now() < deadline, "the reply was never held");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Executed at once; the answer, and what follows it, wait in the proxy.
    assert_eq!(direct.get::<_, u64>("n").await.unwrap(), 1);
    conn.set_read_timeout(Some(HANG)).unwrap();
    let mut buffer = [0; 64];
    assert!(
        conn.read(&mut buffer).is_err(),
        "a held reply was delivered"
    );
    // Other connections are answered meanwhile, and it fired once.
    assert_eq!(send(&mut idle, "INCR n").unwrap(), ":2\r\n");
    proxy.release_reply();
    assert!(!proxy.is_holding());
    conn.set_read_timeout(Some(PROMPTLY)).unwrap();
    let mut reply = Vec::new();
    while reply.len() < b":1\r\n+PONG\r\n".len() {
        let n = conn.read(&mut buffer).unwrap();
        assert!(n > 0, "closed instead of the held reply");
        reply.extend_from_slice(&buffer[..n]);
    }
    assert_eq!(reply, b":1\r\n+PONG\r\n", "in order, after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_after_reply_to_delivers_the_reply_then_partitions() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut conn = raw(&proxy);
    proxy.close_after_reply_to(|chunk| chunk.starts_with(b"INCR"));
    assert_eq!(send(&mut conn, "PING").unwrap(), "+PONG\r\n");
    assert_eq!(send(&mut conn, "INCR n").unwrap(), ":1\r\n");
    let mut buffer = [0; 16];
    assert_eq!(conn.read(&mut buffer).unwrap(), 0, "closed after the reply");
    assert!(proxy.is_cut());
    // A reconnection is held until the heal.
    let mut again = raw(&proxy);
    again.set_read_timeout(Some(HANG)).unwrap();
    assert!(send(&mut again, "INCR n").is_err(), "answered while cut");
    proxy.heal();
    again.set_read_timeout(Some(PROMPTLY)).unwrap();
    let mut reply = [0; 16];
    let n = again.read(&mut reply).unwrap();
    assert_eq!(&reply[..n], b":2\r\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_request_loses_the_matching_request_before_the_server() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let mut direct = server.connection().await;
    let mut conn = raw(&proxy);
    proxy.reset_request(|chunk| chunk.starts_with(b"INCR"));
    assert_eq!(send(&mut conn, "PING").unwrap(), "+PONG\r\n");
    let lost = send(&mut conn, "INCR n");
    assert!(
        lost.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "expected a reset instead of the reply, got {lost:?}"
    );
    assert_eq!(direct.get::<_, Option<u64>>("n").await.unwrap(), None);
    assert_eq!(
        send(&mut raw(&proxy), "INCR n").unwrap(),
        ":1\r\n",
        "fired once"
    );
}
