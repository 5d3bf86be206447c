//! What the seckill tests share: the server binary, a temporary database directory,
//! polling `/healthz`, and reading the stream's state.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lock_examples::seckill::load::Http;
use lock_tests::RedisServer;
use redis::Value;

pub(crate) const STREAM: &str = "seckill:{seckill}:orders";
pub(crate) const GROUP: &str = "persist";

/// A private redis-server that persists every write (AOF, `appendfsync always`), as
/// `seckill-server` requires unless given `--allow-volatile-redis`.
pub(crate) fn persistent_redis() -> RedisServer {
    RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"])
}

/// One heavy sale at a time: the 2000-buyer bursts and the faulty sales each load a
/// two-core machine fully, and two at once (or one beside a RabbitMQ or MariaDB boot)
/// push answers past the service's 2 s Redis timeout (503s the verdict counts). Taken
/// before the sale's servers start.
pub(crate) async fn one_sale_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    static SALE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SALE.lock().await
}

pub(crate) fn server_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_seckill-server"))
}

/// A directory for the test's database, removed on drop.
pub(crate) struct Dir(PathBuf);

impl Dir {
    pub(crate) fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("seckill-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.0.join("orders.db")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `GET /healthz` of every instance until `done` holds for their answers.
pub(crate) async fn wait_health(
    http: &Http,
    urls: &[&str],
    what: &str,
    done: impl Fn(&[serde_json::Value]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut answers = Vec::new();
        for url in urls {
            if let Ok(r) = http.get(&format!("{url}/healthz")).await {
                answers.push(r.json());
            }
        }
        if answers.len() == urls.len() && done(&answers) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {answers:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn drained(h: &serde_json::Value) -> bool {
    h["queue"]["pending"] == 0 && h["queue"]["undelivered"] == false
}

/// `XPENDING` summary: how many entries are delivered but not acknowledged.
pub(crate) async fn pending(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let reply: Value = redis::cmd("XPENDING")
        .arg(STREAM)
        .arg(GROUP)
        .query_async(conn)
        .await
        .unwrap();
    match reply {
        Value::Array(v) => match v.first() {
            Some(Value::Int(n)) => *n,
            other => panic!("XPENDING count: {other:?}"),
        },
        other => panic!("XPENDING: {other:?}"),
    }
}
