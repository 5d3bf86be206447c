//! Self-test of the `lock-tests` harness: the failure injections really do
//! what the suites rely on.

use std::net::TcpStream;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use lock_tests::{RedisServer, free_port};
use redis::AsyncCommands;
use tokio::time::timeout;

fn panic_message(result: std::thread::Result<RedisServer>) -> String {
    let payload = result.expect_err("starting the server should have panicked");
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else {
        panic!("panic payload is not a string")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_and_get_through_connection() {
    let server = RedisServer::start();
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
    let mut conn = server.connection().await;
    let () = conn.set("greeting", "hello").await.unwrap();
    let value: String = conn.get("greeting").await.unwrap();
    assert_eq!(value, "hello");
    assert!(server.log().contains("Ready to accept connections"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_then_restart_on_the_same_port() {
    let mut server = RedisServer::start();
    let port = server.port();
    let first_pid = server.pid();
    let mut conn = server.connection().await;
    let () = conn.set("k", "v").await.unwrap();

    server.kill();
    let after_kill = timeout(Duration::from_secs(5), conn.get::<_, Option<String>>("k"))
        .await
        .expect("a command against a killed server fails, it does not hang");
    assert!(
        after_kill.is_err(),
        "got {after_kill:?} from a killed server"
    );
    assert!(
        server
            .client()
            .get_multiplexed_async_connection()
            .await
            .is_err()
    );

    server.restart();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), first_pid);
    let mut conn = server.connection().await;
    let exists: bool = conn.exists("k").await.unwrap();
    assert!(!exists, "persistence is off: a crash loses the data");
    let () = conn.set("k", "again").await.unwrap();
    let value: String = conn.get("k").await.unwrap();
    assert_eq!(value, "again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_makes_commands_hang_until_resume() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let () = conn.set("k", "v").await.unwrap();

    server.pause();
    let mut paused_conn = conn.clone();
    let hung = timeout(
        Duration::from_millis(200),
        paused_conn.get::<_, String>("k"),
    )
    .await;
    assert!(hung.is_err(), "a paused server answered: {hung:?}");

    server.resume();
    let value: String = conn.get("k").await.unwrap();
    assert_eq!(value, "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_paused_server_works() {
    let mut server = RedisServer::start();
    server.pause();
    server.kill();
    server.restart();
    let mut conn = server.connection().await;
    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_sees_commands() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let mut monitor = server.monitor().await;

    let pong: String = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    assert_eq!(pong, "PONG");
    let seen = monitor
        .wait_for("\"PING\"", Duration::from_secs(5))
        .await
        .expect("MONITOR reports the PING");
    let ping = seen.last().unwrap();
    assert!(ping.contains("127.0.0.1:"), "unexpected line {ping:?}");
    assert!(!ping.starts_with('+'), "unexpected line {ping:?}");

    let _: String = redis::cmd("ECHO")
        .arg("marker")
        .query_async(&mut conn)
        .await
        .unwrap();
    let lines = monitor.lines_within(Duration::from_millis(300)).await;
    assert!(
        lines.iter().any(|l| l.contains("\"ECHO\" \"marker\"")),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains("\"FLUSHALL\"")),
        "{lines:?}"
    );
    assert!(monitor.lines_within(Duration::ZERO).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_arguments_reach_the_server() {
    let server = RedisServer::start_with_args(&["--maxmemory", "10mb"]);
    let mut conn = server.connection().await;
    let config: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("maxmemory")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(config, ["maxmemory", "10485760"]);
}

#[test]
fn drop_stops_the_server() {
    let server = RedisServer::start();
    let port = server.port();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
    drop(server);
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// The session id of process `pid` (`self` for this one), from `/proc/<pid>/stat`.
#[cfg(target_os = "linux")]
fn session_of(pid: &str) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // After the command name (in parentheses): state, ppid, pgrp, session.
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    fields[3].parse().expect("a session id")
}

#[cfg(target_os = "linux")]
#[test]
fn a_server_runs_in_a_session_of_its_own() {
    let mut server = RedisServer::start();
    let own = session_of("self");
    for when in ["started", "restarted"] {
        let pid = server.pid();
        let session = session_of(&pid.to_string());
        assert_eq!(session, pid, "a {when} server leads a session");
        assert_ne!(session, own, "a {when} server is not in the test's session");
        server.kill();
        server.restart();
    }
}

#[test]
fn missing_binary_names_redis_server_bin() {
    let result = catch_unwind(|| RedisServer::start_with("/nonexistent/redis-server", &[]));
    let message = panic_message(result);
    assert!(message.contains("redis-server not found"), "{message}");
    assert!(message.contains("REDIS_SERVER_BIN"), "{message}");
    assert!(
        message.contains("apt-get install redis-server"),
        "{message}"
    );
}

#[test]
fn bad_arguments_panic_with_the_server_output() {
    let result = catch_unwind(AssertUnwindSafe(|| {
        RedisServer::start_with_args(&["--no-such-directive", "1"])
    }));
    let message = panic_message(result);
    assert!(message.contains("did not come up"), "{message}");
    assert!(message.contains("no-such-directive"), "{message}");
}

#[test]
fn free_ports_are_distinct_and_bindable() {
    let a = free_port();
    let b = free_port();
    assert_ne!(a, b);
    for port in [a, b] {
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
