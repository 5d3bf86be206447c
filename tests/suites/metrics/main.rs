//! lock-core's `metrics` feature on real Redis: every outcome counted once with the
//! right labels, read back through metrics-util's `DebuggingRecorder`, and no label
//! carrying a lock name.
//!
//! Renewals, losses and background releases are recorded on the watchdog's and the
//! cleanup tasks' threads, so the recorder is the process-wide one; the tests of this
//! binary take turns (`Tally::start`) so that one test's events never land in
//! another's counts.

#[path = "../common/mod.rs"]
mod common;

use std::sync::OnceLock;
use std::time::Duration;

use common::{client, eventually};
use lock_core::{Begin, Lease, LockConfig, LockOptions, LockScope, RateLimit, Released};
use lock_tests::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::{CompositeKey, MetricKind};

/// Everything recorded since the test started (a snapshot drains the recorder).
struct Tally {
    seen: Vec<(CompositeKey, DebugValue)>,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        lock_core::metrics::describe();
        snapshotter
    })
}

impl Tally {
    /// Waits for this test's turn, then forgets what earlier tests recorded.
    async fn start() -> Self {
        static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let turn = TURN.lock().await;
        snapshotter().snapshot();
        Self {
            seen: Vec::new(),
            _turn: turn,
        }
    }

    /// Takes in what was recorded since the last look.
    fn update(&mut self) -> &mut Self {
        self.seen.extend(entries(snapshotter()));
        self
    }

    /// The sum of the counter `name` over the series that carry `labels`.
    fn counter(&mut self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.update();
        counter_sum(&self.seen, name, labels)
    }

    /// Observations of the histogram `name` in the series that carry `labels`.
    fn observed(&mut self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.update();
        matching(&self.seen, MetricKind::Histogram, name, labels)
            .flat_map(|v| match v {
                DebugValue::Histogram(xs) => xs.iter().map(|x| x.into_inner()).collect(),
                _ => Vec::new(),
            })
            .collect()
    }
}

/// What `snapshotter`'s recorder recorded since the last snapshot (a snapshot drains
/// it), each series with its value.
fn entries(snapshotter: &Snapshotter) -> impl Iterator<Item = (CompositeKey, DebugValue)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key, value))
}

/// The values in `seen` of the metric `name` of `kind` whose series carry `labels`.
fn matching<'a>(
    seen: &'a [(CompositeKey, DebugValue)],
    kind: MetricKind,
    name: &'a str,
    labels: &'a [(&str, &str)],
) -> impl Iterator<Item = &'a DebugValue> + 'a {
    seen.iter().filter_map(move |(key, value)| {
        let k = key.key();
        let has = |(l, v): &(&str, &str)| k.labels().any(|x| x.key() == *l && x.value() == *v);
        (key.kind() == kind && k.name() == name && labels.iter().all(has)).then_some(value)
    })
}

/// The sum of the counter `name` in `seen` over the series that carry `labels`.
fn counter_sum(seen: &[(CompositeKey, DebugValue)], name: &str, labels: &[(&str, &str)]) -> u64 {
    matching(seen, MetricKind::Counter, name, labels)
        .map(|v| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

const ACQ: &str = "lock_acquisitions_total";
const REL: &str = "lock_releases_total";

fn redis(outcome: &'static str) -> [(&'static str, &'static str); 2] {
    [("store", "redis"), ("outcome", outcome)]
}

fn released(result: &'static str) -> [(&'static str, &'static str); 2] {
    [("store", "redis"), ("result", result)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_and_releases_are_counted_once_with_their_outcome() {
    let mut tally = Tally::start().await;
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let b = client(&server, LockConfig::new()).await;

    let held = a.try_lock("report").await.unwrap();
    assert!(b.try_lock("report").await.unwrap_err().is_busy());
    let wait = LockOptions::new().wait(Duration::from_millis(150));
    assert!(b.acquire("report", wait).await.unwrap_err().is_timeout());
    assert_eq!(tally.counter(ACQ, &redis("granted")), 1);
    assert_eq!(tally.counter(ACQ, &redis("busy")), 1);
    assert_eq!(tally.counter(ACQ, &redis("timed_out")), 1);
    assert_eq!(
        tally.counter(ACQ, &[]),
        3,
        "no other outcome, no other store"
    );
    let waits = tally.observed("lock_wait_seconds", &[("store", "redis")]);
    assert_eq!(waits.len(), 3, "one wait per outcome: {waits:?}");
    assert!(
        waits.iter().any(|w| *w >= 0.15),
        "the timed-out wait: {waits:?}"
    );

    assert_eq!(held.release().await.unwrap(), Released::Unlocked);
    assert_eq!(tally.counter(REL, &released("unlocked")), 1);
    assert_eq!(tally.observed("lock_hold_seconds", &[]).len(), 1);

    // A re-entry is its own outcome, and gives back a hold, not the lock.
    LockScope::new()
        .run(async {
            let outer = a.lock("account").await.unwrap();
            let inner = a.lock("account").await.unwrap();
            assert!(matches!(
                inner.release().await,
                Ok(Released::StillHeld { .. })
            ));
            assert_eq!(outer.release().await.unwrap(), Released::Unlocked);
        })
        .await;
    assert_eq!(tally.counter(ACQ, &redis("granted")), 2);
    assert_eq!(tally.counter(ACQ, &redis("reentered")), 1);
    assert_eq!(tally.counter(REL, &released("still_held")), 1);
    assert_eq!(tally.counter(REL, &released("unlocked")), 2);
    assert_eq!(tally.observed("lock_hold_seconds", &[]).len(), 2);

    // A dropped guard's background release is counted when it is done.
    drop(a.try_lock("dropped").await.unwrap());
    eventually(Duration::from_secs(5), "the background release", || {
        let n = tally.counter(REL, &released("unlocked"));
        async move { n == 3 }
    })
    .await;
    assert_eq!(tally.counter(REL, &[]), 4, "each release once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_and_a_lost_lock_are_counted() {
    let mut tally = Tally::start().await;
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(600));
    let a = client(&server, config).await;

    let guard = a.lock("ledger").await.unwrap();
    let renewed = [("store", "redis"), ("result", "renewed")];
    eventually(Duration::from_secs(5), "a watchdog renewal", || {
        let n = tally.counter("lock_renewals_total", &renewed);
        async move { n >= 1 }
    })
    .await;
    let latency = tally.observed("lock_renewal_seconds", &[("store", "redis")]);
    assert!(
        !latency.is_empty(),
        "each renewal call's latency is observed"
    );
    assert_eq!(tally.counter("lock_lost_total", &[]), 0);

    // Someone deletes the key: the next renewal finds no grant, and the loss is counted.
    let mut raw = server.connection().await;
    let _: i64 = redis::cmd("DEL")
        .arg(&guard.keys().key)
        .query_async(&mut raw)
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "the loss", || {
        let n = tally.counter("lock_lost_total", &[("store", "redis")]);
        async move { n == 1 }
    })
    .await;
    let expired = [("store", "redis"), ("result", "expired")];
    assert_eq!(tally.counter("lock_renewals_total", &expired), 1);
    tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("the guard was told too");
    assert!(guard.release().await.unwrap_err().is_expired());
    assert_eq!(tally.counter(REL, &released("expired")), 1);
    assert_eq!(
        tally.counter("lock_lost_total", &[]),
        1,
        "a loss counts once"
    );
}

/// A Redlock counts once per Redlock call under `redlock`, not once per node copy; the
/// in-memory store under `memory`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_and_the_memory_store_are_counted_under_their_own_store() {
    let mut tally = Tally::start().await;
    let masters = lock_tests::RedisMasters::start(3);
    let redlock = lock_core::Redlock::open(masters.urls(), LockConfig::new()).unwrap();
    let g = redlock.try_lock("batch").await.unwrap();
    assert!(redlock.try_lock("batch").await.unwrap_err().is_busy());
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    let rl = |k: &'static str, v: &'static str| [("store", "redlock"), (k, v)];
    assert_eq!(tally.counter(ACQ, &rl("outcome", "granted")), 1);
    assert_eq!(tally.counter(ACQ, &rl("outcome", "busy")), 1);
    assert_eq!(tally.counter(REL, &rl("result", "unlocked")), 1);
    assert_eq!(
        tally
            .observed("lock_hold_seconds", &[("store", "redlock")])
            .len(),
        1
    );
    assert_eq!(tally.counter(ACQ, &[("store", "redis")]), 0, "node copies");
    assert_eq!(tally.counter(REL, &[("store", "redis")]), 0, "node copies");

    let memory = lock_core::MemoryLocks::new();
    let g = memory.try_lock("batch").await.unwrap();
    assert!(memory.try_lock("batch").await.unwrap_err().is_busy());
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    let mem = |k: &'static str, v: &'static str| [("store", "memory"), (k, v)];
    assert_eq!(tally.counter(ACQ, &mem("outcome", "granted")), 1);
    assert_eq!(tally.counter(ACQ, &mem("outcome", "busy")), 1);
    assert_eq!(tally.counter(REL, &mem("result", "unlocked")), 1);
}

/// Each lock metric says what the hold was for: a plain or fair lock, a read or write hold of
/// a read-write lock, or an election's campaign and leadership; a loss under the
/// primitive that lost it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_primitive_is_counted_under_its_own_label() {
    let mut tally = Tally::start().await;
    let memory = lock_core::MemoryLocks::new();
    let plain = memory.try_lock("p").await.unwrap();
    let read = memory
        .acquire("rw", LockOptions::new().read())
        .await
        .unwrap();
    let busy = memory
        .acquire("rw", LockOptions::new().write().wait(Duration::ZERO))
        .await;
    assert!(busy.unwrap_err().is_busy());
    read.release().await.unwrap();
    let write = memory
        .acquire("rw", LockOptions::new().write())
        .await
        .unwrap();
    write.release().await.unwrap();
    plain.release().await.unwrap();
    let fair = memory
        .acquire("f", LockOptions::new().fair())
        .await
        .unwrap();
    fair.release().await.unwrap();
    let election = lock_core::Election::new(memory.clone(), "leader");
    election
        .campaign(Duration::ZERO)
        .await
        .unwrap()
        .resign()
        .await
        .unwrap();

    let of = |p: &'static str, k: &'static str, v: &'static str| {
        [("store", "memory"), ("primitive", p), (k, v)]
    };
    for p in ["lock", "fair_lock", "read_lock", "election"] {
        assert_eq!(tally.counter(ACQ, &of(p, "outcome", "granted")), 1, "{p}");
        assert_eq!(tally.counter(REL, &of(p, "result", "unlocked")), 1, "{p}");
        let held = tally.observed("lock_hold_seconds", &[("primitive", p)]);
        assert_eq!(held.len(), 1, "{p}");
    }
    assert_eq!(tally.counter(ACQ, &of("write_lock", "outcome", "busy")), 1);
    assert_eq!(
        tally.counter(ACQ, &of("write_lock", "outcome", "granted")),
        1
    );
    assert_eq!(tally.counter(ACQ, &[("store", "memory")]), 6);

    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let a = client(&server, config).await;
    let g = a.acquire("rw", LockOptions::new().write()).await.unwrap();
    // Taken over by hand: the watchdog's renewal finds it lost.
    let mut admin = server.connection().await;
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("the loss is seen");
    let mut lost = |p: &'static str| tally.counter("lock_lost_total", &[("primitive", p)]);
    eventually(Duration::from_secs(5), "the loss counted", || {
        let n = lost("write_lock");
        async move { n == 1 }
    })
    .await;
    assert_eq!(lost("lock") + lost("read_lock") + lost("election"), 0);
}

/// A loss a store reports itself (ZooKeeper: the node deleted) counts once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_the_store_reports_is_counted_once() {
    use lock_core::zookeeper_client as zk;
    let mut tally = Tally::start().await;
    let server = lock_tests::ZooKeeperServer::start();
    let locks = lock_core::ZkLocks::connect(&server.connect_string(), LockConfig::new())
        .await
        .unwrap();
    let g = locks.lock("job").await.unwrap();
    let dir = locks.lock_path("job").unwrap();
    let admin = zk::Client::connect(&server.connect_string()).await.unwrap();
    let node = admin.list_children(&dir).await.unwrap().remove(0);
    admin.delete(&format!("{dir}/{node}"), None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("the deletion is reported");
    assert!(g.release().await.unwrap_err().is_lost());
    let lost = [("store", "zookeeper"), ("primitive", "lock")];
    assert_eq!(
        tally.counter("lock_lost_total", &lost),
        1,
        "a loss counts once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limit_decisions_are_counted_and_a_peek_is_not() {
    let mut tally = Tally::start().await;
    let server = RedisServer::start();
    let a = client(&server, LockConfig::new()).await;
    let limiter = a.rate_limiter("login", RateLimit::per_minute(1));

    assert!(limiter.check("10.0.0.1").await.unwrap().allowed);
    assert!(!limiter.peek("10.0.0.1").await.unwrap().allowed);
    assert!(!limiter.check("10.0.0.1").await.unwrap().allowed);
    let name = "rate_limit_decisions_total";
    assert_eq!(tally.counter(name, &[("outcome", "allowed")]), 1);
    assert_eq!(tally.counter(name, &[("outcome", "limited")]), 1);
    assert_eq!(tally.counter(name, &[]), 2);
}

/// Redis gone: lock-tower's layer lets the request through (or refuses it), and says so;
/// the idempotency store counts the lookup as `unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_open_or_closed_and_an_unavailable_store_are_counted() {
    use axum::body::Body;
    use lock_tower::rate_limit::{HeaderKey, RateLimitLayer};
    use tower::ServiceExt;

    let mut tally = Tally::start().await;
    let mut server = RedisServer::start();
    let config = LockConfig::new().with_command_timeout(Duration::from_millis(300));
    let c = client(&server, config).await;
    let app = |fail_closed: bool| {
        let limiter = c.rate_limiter("api", RateLimit::per_second(100));
        let key = HeaderKey(http::HeaderName::from_static("x-user-id"));
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(RateLimitLayer::new(limiter, key).fail_closed(fail_closed))
    };
    let get = || {
        let r = http::Request::get("/").header("x-user-id", "7");
        r.body(Body::empty()).unwrap()
    };
    assert_eq!(app(false).oneshot(get()).await.unwrap().status(), 200);
    server.kill();
    assert_eq!(app(false).oneshot(get()).await.unwrap().status(), 200);
    assert_eq!(app(true).oneshot(get()).await.unwrap().status(), 503);
    let store = c.idempotency_store("idem");
    assert!(
        store
            .begin("k", "fp", Duration::from_secs(5))
            .await
            .is_err()
    );

    let name = "rate_limit_decisions_total";
    for outcome in ["allowed", "failed_open", "failed_closed"] {
        assert_eq!(tally.counter(name, &[("outcome", outcome)]), 1, "{outcome}");
    }
    assert_eq!(
        tally.counter(name, &[]),
        3,
        "a failed check is no other decision"
    );
    let unavailable = [("outcome", "unavailable")];
    assert_eq!(tally.counter("idempotency_outcomes_total", &unavailable), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_outcomes_are_counted() {
    let mut tally = Tally::start().await;
    let server = RedisServer::start();
    let store = client(&server, LockConfig::new())
        .await
        .idempotency_store("idem");
    let lease = Duration::from_secs(10);

    let Begin::New(claim) = store.begin("k", "fp-a", lease).await.unwrap() else {
        panic!("a new key is claimed");
    };
    let found = store.begin("k", "fp-a", lease).await.unwrap();
    assert!(matches!(found, Begin::InFlight { .. }), "{found:?}");
    claim.complete(b"200", lease).await.unwrap();
    let found = store.begin("k", "fp-a", lease).await.unwrap();
    assert!(matches!(found, Begin::Completed(_)), "{found:?}");
    let found = store.begin("k", "fp-b", lease).await.unwrap();
    assert!(matches!(found, Begin::Mismatch), "{found:?}");

    let name = "idempotency_outcomes_total";
    for outcome in ["new", "in_flight", "replayed", "mismatch"] {
        assert_eq!(tally.counter(name, &[("outcome", outcome)]), 1, "{outcome}");
    }
    assert_eq!(tally.counter(name, &[]), 4);
}

/// Every label value comes from a fixed set: never the lock's name, whatever it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_label_carries_a_lock_name() {
    let mut tally = Tally::start().await;
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let a = client(&server, config).await;
    let name = "customer-4711-secret";

    let g = a.lock(name).await.unwrap();
    let fixed = LockOptions::new().lease(Lease::Fixed(Duration::from_secs(5)));
    assert!(a.acquire((name, 2_u64), fixed).await.is_ok());
    let _ = a.try_lock(name).await; // busy (another scope)
    let limiter = a.rate_limiter(name, RateLimit::per_minute(1));
    let _ = limiter.check(name).await;
    let _ = a
        .idempotency_store(name)
        .begin(name, "fp", Duration::from_secs(5))
        .await;
    eventually(Duration::from_secs(5), "a renewal", || {
        let n = tally.counter("lock_renewals_total", &[]);
        async move { n >= 1 }
    })
    .await;
    g.release().await.unwrap();

    tally.update();
    assert!(
        tally.seen.len() >= 6,
        "events were recorded: {}",
        tally.seen.len()
    );
    let allowed: Vec<&str> = concat!(
        "redis redis_cluster redlock zookeeper mysql postgres memory ",
        "granted reentered busy timed_out error unlocked still_held expired not_owner renewed ",
        "allowed limited failed_open failed_closed new replayed in_flight mismatch unavailable ",
        "lock fair_lock read_lock write_lock election",
    )
    .split(' ')
    .collect();
    for (key, _) in &tally.seen {
        for label in key.key().labels() {
            assert!(
                ["store", "primitive", "outcome", "result"].contains(&label.key()),
                "unexpected label {label:?} on {}",
                key.key().name()
            );
            assert!(!label.value().contains("customer"), "{label:?}");
            assert!(
                allowed.contains(&label.value()),
                "{label:?} is not from a fixed set"
            );
        }
    }
}

/// Handles are kept for the global recorder alone: the events of code run under a local
/// recorder reach that recorder, every time, and never the global one; the same events
/// after it go to the global one again.
#[test]
fn a_local_recorder_gets_the_events_recorded_under_it() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut tally = rt.block_on(Tally::start());
    let memory = lock_core::MemoryLocks::new();
    let cycle = || async {
        let g = memory.try_lock("local").await.unwrap();
        assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    };
    let mem = |k: &'static str, v: &'static str| [("store", "memory"), (k, v)];
    // Once under the global recorder, so its handles are kept before the local one.
    rt.block_on(cycle());
    assert_eq!(tally.counter(ACQ, &mem("outcome", "granted")), 1);

    let local = DebuggingRecorder::new();
    let seen = local.snapshotter();
    for _ in 0..2 {
        metrics::with_local_recorder(&local, || rt.block_on(cycle()));
    }
    // One snapshot: taking one drains the recorder.
    let snapshot: Vec<_> = entries(&seen).collect();
    let counted = |name, label| counter_sum(&snapshot, name, &[label]);
    assert_eq!(
        counted(ACQ, ("outcome", "granted")),
        2,
        "the local recorder's own"
    );
    assert_eq!(
        counted(REL, ("result", "unlocked")),
        2,
        "the local recorder's own"
    );
    assert_eq!(
        tally.counter(ACQ, &mem("outcome", "granted")),
        1,
        "nothing under the local recorder reaches the global one"
    );

    rt.block_on(cycle());
    assert_eq!(tally.counter(ACQ, &mem("outcome", "granted")), 2);
    assert_eq!(tally.counter(REL, &mem("result", "unlocked")), 2);
}

/// A renewal answered after its grant was released is no loss: hundreds of short holds
/// of a PostgreSQL lock, its session checked every 2 ms (a check that waits for the
/// session while the release gives it back finds none), count no lost lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_racing_a_release_counts_no_loss() {
    let mut tally = Tally::start().await;
    let server = lock_tests::PostgresServer::start();
    let config = LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(800))
        .with_watchdog_period(Duration::from_millis(2));
    let locks = lock_core::PostgresLocks::connect(&server.url(), config)
        .await
        .unwrap();
    for i in 0..300 {
        let g = locks.lock(("race", i % 3)).await.unwrap();
        tokio::time::sleep(Duration::from_micros(fastrand::u64(0..3000))).await;
        assert_eq!(g.release().await.unwrap(), Released::Unlocked, "hold {i}");
    }
    let renewed = tally.counter("lock_renewals_total", &[("store", "postgres")]);
    // Not vacuous: the watchdog did check the sessions of held locks.
    assert!(
        renewed >= 10,
        "the sessions were checked only {renewed} times"
    );
    assert_eq!(
        tally.counter("lock_lost_total", &[("store", "postgres")]),
        0,
        "released holds counted as lost"
    );
}
