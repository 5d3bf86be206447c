//! `#[cache_lock]` on real Redis: the seed's seckill, duplicates, waiting, the
//! anti-resubmit window, re-entry, and release on every exit path.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{client, eventually, exists};
use lock_core::{LockClient, LockConfig, LockError};
use lock_macros::cache_lock;
use lock_tests::RedisServer;
use redis::AsyncCommands;

#[derive(Debug)]
enum ShopError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl From<LockError> for ShopError {
    fn from(e: LockError) -> Self {
        ShopError::Lock(e)
    }
}

impl From<redis::RedisError> for ShopError {
    fn from(e: redis::RedisError) -> Self {
        ShopError::Redis(e)
    }
}

impl ShopError {
    fn is_busy(&self) -> bool {
        matches!(self, ShopError::Lock(e) if e.is_busy())
    }
}

struct Shop {
    locks: LockClient,
    redis: redis::aio::MultiplexedConnection,
}

impl Shop {
    /// The seed's seckill body: a deliberately non-atomic read-modify-write of the stock,
    /// safe only because of the lock. Returns whether one item was sold.
    #[cache_lock(prefix = "seckill", key = goods, expire = "5s", client = self.locks)]
    async fn buy(&self, goods: u32) -> Result<bool, ShopError> {
        let mut conn = self.redis.clone();
        let key = format!("stock:{goods}");
        let stock: i64 = conn.get(&key).await?;
        if stock <= 0 {
            return Ok(false);
        }
        tokio::task::yield_now().await;
        let () = conn.set(&key, stock - 1).await?;
        Ok(true)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seckill_1000_buyers_on_two_goods_never_oversell() {
    let server = RedisServer::start();
    let mut raw = server.connection().await;
    let initial = 100_i64;
    for goods in [1, 2] {
        let () = raw.set(format!("stock:{goods}"), initial).await.unwrap();
    }
    let shop = Arc::new(Shop {
        locks: client(&server, LockConfig::new()).await,
        redis: raw.clone(),
    });
    let mut calls = Vec::new();
    for i in 0..1000u32 {
        let shop = shop.clone();
        calls.push(tokio::spawn(async move {
            (i % 2 + 1, shop.buy(i % 2 + 1).await)
        }));
    }
    let (mut sold, mut sold_out, mut busy) = ([0i64; 3], 0, 0);
    for c in calls {
        match c.await.unwrap() {
            (goods, Ok(true)) => sold[goods as usize] += 1,
            (_, Ok(false)) => sold_out += 1,
            (_, Err(e)) if e.is_busy() => busy += 1,
            (_, Err(e)) => panic!("unexpected error {e:?}"),
        }
    }
    assert_eq!(
        sold[1] + sold[2] + sold_out + busy,
        1000,
        "every call is accounted for"
    );
    assert!(busy > 0, "1000 concurrent calls with wait = 0 must collide");
    assert!(sold[1] > 0 && sold[2] > 0, "both goods sold: {sold:?}");
    for goods in [1, 2] {
        let left: i64 = raw.get(format!("stock:{goods}")).await.unwrap();
        assert!(left >= 0, "oversold goods {goods}: {left}");
        assert_eq!(left, initial - sold[goods], "lost update on goods {goods}");
    }
}

struct Counter {
    locks: LockClient,
    inside: AtomicUsize,
    most: AtomicUsize,
    runs: AtomicUsize,
}

impl Counter {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.runs.fetch_add(1, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    #[cache_lock(prefix = "dup", key = id, client = self.locks)]
    async fn no_wait(&self, id: u64) -> Result<(), LockError> {
        self.enter();
        tokio::time::sleep(Duration::from_millis(20)).await;
        self.leave();
        Ok(())
    }

    #[cache_lock(prefix = "dup", key = id, wait = "5s", client = self.locks)]
    async fn waiting(&self, id: u64) -> Result<(), LockError> {
        self.enter();
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.leave();
        Ok(())
    }
}

async fn counter(server: &RedisServer) -> Arc<Counter> {
    Arc::new(Counter {
        locks: client(server, LockConfig::new()).await,
        inside: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        runs: AtomicUsize::new(0),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_duplicates_one_at_a_time() {
    let server = RedisServer::start();
    let c = counter(&server).await;
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.no_wait(7).await })
        })
        .collect();
    let mut busy = 0;
    for call in calls {
        if let Err(e) = call.await.unwrap() {
            assert!(e.is_busy(), "{e}");
            busy += 1;
        }
    }
    assert_eq!(c.most.load(Ordering::SeqCst), 1, "two bodies overlapped");
    assert_eq!(busy + c.runs.load(Ordering::SeqCst), 50);
    assert!(busy > 0);

    // With a wait budget, all 50 run, one after another.
    let c = counter(&server).await;
    let calls: Vec<_> = (0..50)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move { c.waiting(8).await })
        })
        .collect();
    for call in calls {
        call.await.unwrap().unwrap();
    }
    assert_eq!(c.runs.load(Ordering::SeqCst), 50);
    assert_eq!(c.most.load(Ordering::SeqCst), 1, "two bodies overlapped");
}

#[cache_lock(prefix = "submit", key = form, expire = "600ms", release = "on_expiry", client = locks)]
async fn submit(locks: &LockClient, form: &str) -> Result<(), LockError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_expiry_keeps_an_anti_resubmit_window() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let started = Instant::now();
    submit(&c, "form-1").await.unwrap();
    assert!(
        submit(&c, "form-1").await.unwrap_err().is_busy(),
        "resubmitted within the window"
    );
    submit(&c, "form-2").await.unwrap();
    assert_eq!(
        c.held_count(),
        0,
        "nothing renewed or tracked after the body"
    );
    let hash = c.keys(("submit", "form-1")).unwrap().key;
    eventually(Duration::from_secs(3), "the window to close", || async {
        !exists(&server, &hash).await
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(550),
        "released early"
    );
    submit(&c, "form-1").await.unwrap();
}

struct Account {
    locks: LockClient,
    id: u64,
}

struct Transfer {
    from: Account,
    amount: u64,
}

impl Account {
    #[cache_lock(prefix = "account", key = self.id, client = self.locks)]
    async fn debit(&self, amount: u64) -> Result<u64, LockError> {
        // Nested call with the same key in the same task: re-enters.
        self.audit(amount).await
    }

    #[cache_lock(prefix = "account", key = self.id, client = self.locks)]
    async fn audit(&self, amount: u64) -> Result<u64, LockError> {
        Ok(amount)
    }
}

#[cache_lock(prefix = "account", key = t.from.id, client = t.from.locks)]
async fn transfer_field_path(t: &Transfer) -> Result<u64, LockError> {
    t.from.debit(t.amount).await
}

#[cache_lock(prefix = "generic", key = (kind, id), client = locks)]
async fn generic<T: lock_core::KeyPart + std::fmt::Display + Send + Sync>(
    locks: &LockClient,
    kind: &str,
    id: T,
) -> Result<String, LockError> {
    Ok(format!("{kind}/{id}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_calls_reenter_and_other_tasks_are_excluded() {
    let server = RedisServer::start();
    let locks = client(&server, LockConfig::new()).await;
    let t = Transfer {
        from: Account {
            locks: locks.clone(),
            id: 9,
        },
        amount: 5,
    };
    let r = tokio::time::timeout(Duration::from_secs(2), transfer_field_path(&t))
        .await
        .expect("re-entry must not deadlock");
    assert_eq!(r.unwrap(), 5);
    assert_eq!(generic(&locks, "a:b", 3_u8).await.unwrap(), "a:b/3");

    // Another task holding account 9 shuts the annotated fn out.
    let guard = locks.try_lock(("account", 9_u64)).await.unwrap();
    let other = tokio::spawn(async move { t.from.debit(1).await });
    assert!(other.await.unwrap().unwrap_err().is_busy());
    guard.release().await.unwrap();
}

#[cache_lock(prefix = "slow", key = id, client = locks)]
async fn slow(
    locks: &LockClient,
    id: u64,
    started: tokio::sync::oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = started.send(());
    std::future::pending::<()>().await;
    Ok(())
}

#[cache_lock(prefix = "boom", key = id, client = locks)]
async fn boom(locks: &LockClient, id: u64) -> Result<(), LockError> {
    let _ = locks;
    if id > 0 {
        panic!("the body panicked");
    }
    Ok(())
}

#[cache_lock(prefix = "early", key = id, client = locks)]
async fn early(locks: &LockClient, id: u64) -> Result<(), ShopError> {
    let _ = locks;
    let parsed: Result<u64, redis::RedisError> =
        Err(redis::RedisError::from((redis::ErrorKind::Io, "simulated")));
    parsed?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_on_abort_panic_and_error() {
    let server = RedisServer::start();
    let locks = client(&server, LockConfig::new()).await;

    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = {
        let locks = locks.clone();
        tokio::spawn(async move { slow(&locks, 1, tx).await })
    };
    rx.await.unwrap();
    let hash = locks.keys(("slow", 1_u64)).unwrap().key;
    assert!(exists(&server, &hash).await);
    task.abort();
    let _ = task.await;
    eventually(
        Duration::from_millis(100),
        "release after abort",
        || async { !exists(&server, &hash).await },
    )
    .await;

    let task = {
        let locks = locks.clone();
        tokio::spawn(async move { boom(&locks, 1).await })
    };
    assert!(task.await.unwrap_err().is_panic());
    let hash = locks.keys(("boom", 1_u64)).unwrap().key;
    eventually(
        Duration::from_millis(500),
        "release after panic",
        || async { !exists(&server, &hash).await },
    )
    .await;
    boom(&locks, 0).await.unwrap();

    match early(&locks, 1).await {
        Err(ShopError::Redis(e)) => assert!(e.to_string().contains("simulated"), "{e}"),
        other => panic!("expected the body's error, got {other:?}"),
    }
    let hash = locks.keys(("early", 1_u64)).unwrap().key;
    assert!(
        !exists(&server, &hash).await,
        "`?` in the body released the lock"
    );
    assert_eq!(locks.held_count(), 0);
}

#[cache_lock(prefix = "pay", key = order, expire = "5s", wait = "0ms", client = locks)]
async fn pay(
    locks: &LockClient,
    order: u64,
    held: tokio::sync::oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = held.send(());
    std::future::pending().await
}

/// Without `delimiter`, the attribute locks the name `client.lock()` would: the client's
/// configured delimiter, not ":".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_delimiter_the_clients_delimiter_is_used() {
    let server = RedisServer::start();
    let locks = client(&server, LockConfig::new().with_delimiter("|")).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = {
        let locks = locks.clone();
        tokio::spawn(async move { pay(&locks, 42, tx).await })
    };
    rx.await.unwrap();
    let key = locks.keys(("pay", 42_u64)).unwrap().key;
    assert!(key.contains("pay|42"), "{key}");
    assert!(exists(&server, &key).await, "the macro locked another key");
    let busy = locks.try_lock(("pay", 42_u64)).await.unwrap_err();
    assert!(busy.is_busy(), "{busy}");
    task.abort();
}
