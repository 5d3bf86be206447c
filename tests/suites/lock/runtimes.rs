//! One client outliving the runtime it was used on: a guard dropped on another
//! runtime or on none, a batch lane whose call was in flight when its runtime ended,
//! and the watchdog of a lock taken on a runtime that has since ended. Background work
//! must run on a runtime that is alive, and no state may wait on a task that never runs.

use crate::common;

use std::cell::RefCell;
use std::time::{Duration, Instant};

use common::{assert_really_held, client, eventually, exists, get, runtime};
use lock_core::{Lease, LockClient, LockConfig, LockOptions, RateLimit};
use lock_tests::{RedisServer, TcpProxy};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Polls `attempt` on `rt` until it answers true or `limit` passes; false then.
fn within<F, Fut>(rt: &tokio::runtime::Runtime, limit: Duration, mut attempt: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    rt.block_on(async {
        while start.elapsed() < limit {
            if attempt().await {
                return true;
            }
            tokio::time::sleep(ms(20)).await;
        }
        false
    })
}

/// Takes and gives back `name` on `client`, on `rt`, until it works or `limit` passes;
/// the last error then. `on_error` sees every error on the way.
fn serves(
    rt: &tokio::runtime::Runtime,
    limit: Duration,
    client: &LockClient,
    name: &str,
    on_error: impl Fn(&lock_core::LockError),
) -> Result<(), String> {
    let last = &RefCell::new(String::new());
    let on_error = &on_error;
    let served = within(rt, limit, || async move {
        match client.try_lock(name).await {
            Ok(g) => g.release().await.is_ok(),
            Err(e) => {
                on_error(&e);
                *last.borrow_mut() = e.to_string();
                false
            }
        }
    });
    if served { Ok(()) } else { Err(last.take()) }
}

#[test]
fn a_guard_dropped_on_a_second_runtime_after_the_first_ended_frees_its_name() {
    let server = RedisServer::start();
    let rt1 = runtime();
    let client = rt1.block_on(LockClient::open(server.url())).unwrap();
    let opts = LockOptions::new()
        .wait(Duration::ZERO)
        .lease(Lease::Fixed(ms(100)));
    let guard = rt1.block_on(client.acquire("shared", opts)).unwrap();
    drop(rt1);

    let rt2 = runtime();
    rt2.block_on(async { drop(guard) });
    // The lease is long over after the first round; what may still say Busy is only
    // this client's own bookkeeping of a release that never ran.
    let (client, last) = (&client, &RefCell::new(String::new()));
    let freed = within(&rt2, Duration::from_secs(5), || async move {
        match client.try_lock("shared").await {
            Ok(g) => {
                g.release().await.unwrap();
                true
            }
            Err(e) => {
                *last.borrow_mut() = e.to_string();
                false
            }
        }
    });
    assert!(
        freed,
        "the name stayed unavailable on this client: {}",
        last.borrow()
    );
}

#[test]
fn a_guard_dropped_after_its_runtime_ended_is_released_in_redis() {
    let server = RedisServer::start();
    let rt1 = runtime();
    let client = rt1.block_on(LockClient::open(server.url())).unwrap();
    let long = LockOptions::new()
        .wait(Duration::ZERO)
        .lease(Lease::Fixed(Duration::from_secs(60)));
    let on_rt2 = rt1
        .block_on(client.acquire("on-rt2", long.clone()))
        .unwrap();
    let on_none = rt1.block_on(client.acquire("on-none", long)).unwrap();
    let keys = [on_rt2.keys().key.clone(), on_none.keys().key.clone()];
    drop(rt1);

    let rt2 = runtime();
    rt2.block_on(async { drop(on_rt2) });
    // Dropped on a thread with no runtime at all.
    std::thread::spawn(move || drop(on_none)).join().unwrap();
    for key in &keys {
        let gone = within(&rt2, Duration::from_secs(5), || async {
            !exists(&server, key).await
        });
        assert!(
            gone,
            "{key} is still held: the background release never ran"
        );
    }
}

#[test]
fn a_batch_lane_whose_call_was_in_flight_when_its_runtime_ended_serves_the_next_runtime() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let config = LockConfig::new()
        .with_command_timeout(ms(500))
        .with_batching(true)
        .with_batches_in_flight(1);
    let rt1 = runtime();
    let client = rt1
        .block_on(LockClient::open_with_config(proxy.url().as_str(), config))
        .unwrap();
    let limiter = client.rate_limiter("api", RateLimit::per_second(1000).with_burst(1000));
    rt1.block_on(limiter.check("warm-up")).unwrap();

    // One check goes alone and hangs on the cut connection; a second queues behind it.
    proxy.cut();
    for _ in 0..2 {
        let l = limiter.clone();
        rt1.spawn(async move { l.check("k").await });
    }
    let queued = within(&rt1, Duration::from_secs(5), || async {
        client.queued_calls() == 1
    });
    assert!(queued, "the second check did not queue behind the first");
    drop(rt1);
    proxy.heal();

    let rt2 = runtime();
    let (limiter, last) = (&limiter, &RefCell::new(String::new()));
    let served = within(&rt2, Duration::from_secs(5), || async move {
        match limiter.check("k").await {
            Ok(_) => true,
            Err(e) => {
                *last.borrow_mut() = e.to_string();
                false
            }
        }
    });
    assert!(served, "the lane stayed busy: {}", last.borrow());
    assert_eq!(client.queued_calls(), 0);
}

#[test]
fn the_watchdog_keeps_renewing_after_the_runtime_that_started_it_ended() {
    let server = RedisServer::start();
    let lease = ms(600);
    let config = LockConfig::new().with_watchdog_lease(lease);
    let rt1 = runtime();
    let client = rt1
        .block_on(LockClient::open_with_config(server.url().as_str(), config))
        .unwrap();
    let guard = rt1.block_on(client.lock("watched")).unwrap();
    let (key, value) = (guard.keys().key.clone(), guard.grant_value().to_owned());
    drop(rt1);

    // Held from a thread with no runtime for several leases: only renewals keep it.
    let rt2 = runtime();
    let until = Instant::now() + lease * 4;
    while Instant::now() < until {
        let stored = rt2.block_on(get(&server, &key));
        assert_eq!(
            stored.as_deref(),
            Some(value.as_str()),
            "the lock was not renewed after its runtime ended"
        );
        assert!(
            guard.is_held(),
            "the guard gave up a lock Redis still holds"
        );
        std::thread::sleep(lease / 6);
    }
    rt2.block_on(guard.release()).unwrap();
}

/// A lock taken on a current-thread runtime that stays alive but idle (sync code
/// between `block_on` calls) is still renewed. Its connection's tasks run only inside
/// `block_on`, so the renewals sent from the background runtime go unanswered; that
/// connection is found silent, and the next renewal opens one there.
#[test]
fn the_watchdog_keeps_renewing_while_the_runtime_that_took_the_lock_idles() {
    let server = RedisServer::start();
    let lease = ms(1500);
    let config = LockConfig::new()
        .with_watchdog_lease(lease)
        .with_command_timeout(ms(100));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(LockClient::open_with_config(server.url().as_str(), config))
        .unwrap();
    let guard = rt.block_on(client.lock("idle")).unwrap();
    let (key, value) = (guard.keys().key.clone(), guard.grant_value().to_owned());
    // The runtime idles for two leases: the scenario, not a wait for a condition.
    std::thread::sleep(lease * 2);
    let stored = runtime().block_on(get(&server, &key));
    assert_eq!(
        stored.as_deref(),
        Some(value.as_str()),
        "the lock was not renewed while its runtime idled"
    );
    assert!(
        guard.is_held(),
        "the guard gave up a lock Redis still holds"
    );
    rt.block_on(guard.release()).unwrap();
}

/// A client shared by several runtimes (a global client in `#[tokio::test]`s)
/// keeps renewing and waking waiters after the runtime that started its tasks ended.
#[test]
fn a_client_outlives_the_runtime_that_first_used_it() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_watchdog_lease(Duration::from_millis(300));
    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let (c, other) = rt1.block_on(async {
        let c = client(&server, config.clone()).await;
        let other = client(&server, config.clone()).await;
        // Starts the watchdog and the pub/sub tasks on rt1.
        let g = other.try_lock("w").await.unwrap();
        let waiter = c.acquire("w", LockOptions::new().wait(Duration::from_secs(5)));
        let (got, _) = tokio::join!(waiter, async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.release().await.unwrap();
        });
        got.unwrap().release().await.unwrap();
        (c, other)
    });
    drop(rt1);
    let rt2 = tokio::runtime::Runtime::new().unwrap();
    rt2.block_on(async {
        // The redis-rs connection's own task ended with rt1: the first call connects
        // again, on this runtime.
        for client in [&c, &other] {
            let g = client.try_lock("reconnect").await.unwrap();
            g.release().await.unwrap();
        }
        let g = c.lock("renewed").await.unwrap();
        // Three leases: only renewals keep it.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert_really_held(&server, &other, &g).await;
        g.release().await.unwrap();
        // Waiters subscribe again.
        let theirs = other.try_lock("w2").await.unwrap();
        let channel = c.keys("w2").unwrap().channel();
        let waiter = {
            let c = c.clone();
            tokio::spawn(async move {
                c.acquire("w2", LockOptions::new().wait(Duration::from_secs(5)))
                    .await
            })
        };
        eventually(
            Duration::from_secs(2),
            "the waiter's subscription",
            || async { common::subscribers(&server, &channel).await == 1 },
        )
        .await;
        theirs.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    });
}

/// Kills `server` and leaves `client`'s reconnect in progress on `rt`: the first call
/// finds the connection gone and starts a reconnect, refused at once and then waiting
/// (at least 100 ms) to try again; the second call waits on that reconnect.
fn leave_a_reconnect_waiting(
    server: &mut RedisServer,
    rt: &tokio::runtime::Runtime,
    client: &LockClient,
) {
    server.kill();
    rt.block_on(async {
        let dropped = client.try_lock("other").await;
        assert!(dropped.is_err(), "a call on a dead server succeeded");
        let stalled = tokio::time::timeout(ms(50), client.try_lock("other")).await;
        assert!(
            stalled.is_err(),
            "the reconnect was not waiting: {stalled:?}"
        );
    });
}

/// The runtime a client used ended while its connection was reconnecting (the server
/// had gone, and the reconnect was waiting to try again): that reconnect holds the
/// ended runtime's timer, and neither the background release of a guard dropped
/// afterwards nor the client's next calls on another runtime may wait on it.
#[test]
fn a_runtime_that_ended_mid_reconnect_leaves_the_client_usable() {
    // Written to disk at once, so the lock outlives the restart.
    let mut server =
        RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let rt1 = runtime();
    let client = rt1.block_on(LockClient::open(server.url())).unwrap();
    let long = LockOptions::new()
        .wait(Duration::ZERO)
        .lease(Lease::Fixed(Duration::from_secs(60)));
    let guard = rt1.block_on(client.acquire("held", long)).unwrap();
    let key = guard.keys().key.clone();

    leave_a_reconnect_waiting(&mut server, &rt1, &client);
    drop(rt1);
    server.restart();

    std::thread::spawn(move || drop(guard)).join().unwrap();
    let rt2 = runtime();
    let gone = within(&rt2, Duration::from_secs(10), || async {
        !exists(&server, &key).await
    });
    assert!(
        gone,
        "{key} is still held: the background release never ran"
    );
    let served = serves(&rt2, Duration::from_secs(10), &client, "after", |_| {});
    served.unwrap_or_else(|e| panic!("the client did not recover: {e}"));
}

/// A reconnect started by a call on a short-lived runtime that then ended, while the
/// runtime the client was made on lives on: the next call on that runtime fails (the
/// reconnect it would wait on is dead) but does not panic, and the one after works.
#[test]
fn a_reconnect_left_by_another_ended_runtime_costs_one_failed_call() {
    let mut server = RedisServer::start();
    let main = tokio::runtime::Runtime::new().unwrap();
    let client = main.block_on(LockClient::open(server.url())).unwrap();

    let short = runtime();
    leave_a_reconnect_waiting(&mut server, &short, &client);
    drop(short);
    server.restart();

    // redis-rs panics inside the dead reconnect (its panic message is printed); the
    // call answers an error instead, and the client connects again.
    let served = serves(&main, Duration::from_secs(10), &client, "after", |e| {
        assert!(e.is_redis(), "{e}");
    });
    served.unwrap_or_else(|e| panic!("the client did not recover: {e}"));
}

/// The constructors that connect later still need a runtime for the connection's task:
/// outside one they answer an error that says so (redis-rs would panic).
#[test]
fn lazy_constructors_outside_a_runtime_answer_an_error() {
    let server = RedisServer::start();
    let Err(e) = LockClient::open_lazy(server.url(), LockConfig::new()) else {
        panic!("open_lazy outside a runtime made a client");
    };
    assert!(e.to_string().contains("tokio runtime"), "{e}");
    let Err(e) = lock_core::Redlock::open([server.url()], LockConfig::new()) else {
        panic!("Redlock::open outside a runtime made a Redlock");
    };
    assert!(e.to_string().contains("tokio runtime"), "{e}");
}

/// A release queued behind a call in flight on another runtime, which then ended: the
/// queue is sent from a live runtime, its caller gets the error of a call Redis did not
/// answer (the connection is cut), and the release is sent again in the background, so
/// the lock is free long before its lease ends.
#[test]
fn a_release_whose_batch_ended_with_another_runtime_is_sent_again() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let config = LockConfig::new()
        .with_command_timeout(Duration::from_secs(5))
        .with_batching(true)
        .with_batches_in_flight(1);
    let (rt1, rt2) = (runtime(), runtime());
    let client = rt2
        .block_on(LockClient::open_with_config(proxy.url().as_str(), config))
        .unwrap();
    let minute = LockOptions::new().lease(Lease::Fixed(Duration::from_secs(60)));
    let (first, second) = rt2.block_on(async {
        let warm = client.acquire("warm", minute.clone()).await.unwrap();
        warm.release().await.unwrap();
        (
            client.acquire("first", minute.clone()).await.unwrap(),
            client.acquire("second", minute).await.unwrap(),
        )
    });
    let key = second.keys().key.clone();
    // The first release goes alone on the first runtime and hangs on the cut
    // connection; the second queues behind it.
    proxy.cut();
    rt1.spawn(async move { first.release().await });
    let released = rt2.spawn(async move { second.release().await });
    let queued = within(&rt2, Duration::from_secs(5), || async {
        client.queued_calls() == 1
    });
    assert!(queued, "the second release did not queue behind the first");
    drop(rt1);
    let answer = rt2.block_on(released).unwrap();
    assert!(answer.is_err(), "{answer:?}");
    proxy.heal();
    let freed = within(&rt2, Duration::from_secs(5), || {
        let (server, key) = (&server, &key);
        async move { !exists(server, key).await }
    });
    assert!(freed, "the release was not sent again: {key} is still held");
}

/// A connection opened by a call that then gave up (its time limit passed) in the same
/// poll, on a one-thread runtime that ended right after: the connection's tasks never
/// ran. The link must still count as ended, so that the next call, on another runtime,
/// opens a new one instead of queueing on a link nobody reads.
#[test]
fn a_link_whose_tasks_never_ran_before_its_runtime_ended_is_opened_again() {
    let server = RedisServer::start();
    let config = LockConfig::new().with_command_timeout(ms(300));
    let rt1 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt1
        .block_on(async { LockClient::open_lazy(server.url(), config) })
        .unwrap();
    rt1.block_on(async {
        // Blocks the only thread past the 100 ms limit but short of the client's own
        // 300 ms, so that the connect's readiness and the outer limit are seen in one
        // poll: the link starts, then the call returns at once, cut short.
        tokio::spawn(async { std::thread::sleep(ms(200)) });
        let gave_up = tokio::time::timeout(ms(100), client.try_lock("first")).await;
        assert!(
            gave_up.is_err(),
            "the first call was not cut short: {gave_up:?}"
        );
    });
    drop(rt1);

    let rt2 = runtime();
    let served = serves(&rt2, Duration::from_secs(5), &client, "second", |_| {});
    served.unwrap_or_else(|e| panic!("the client never opened a new link: {e}"));
}

/// The pub/sub hub started by a waiter on a runtime that then ended: waiters on a
/// runtime that lives on are still woken by releases, not by their backoff.
#[test]
fn waiters_are_woken_after_the_runtime_that_started_the_hub_ended() {
    let server = RedisServer::start();
    let main = runtime();
    let holder = main.block_on(client(&server, LockConfig::new()));
    let (x, y) = (
        main.block_on(holder.try_lock("x")).unwrap(),
        main.block_on(holder.try_lock("y")).unwrap(),
    );
    let slow = common::steady_backoff(Duration::from_secs(10));
    let waiting = main.block_on(client(&server, LockConfig::new().with_backoff(slow)));
    let long = || LockOptions::new().wait(Duration::from_secs(20));
    let subscribed = |name: &str| {
        let channel = waiting.keys(name).unwrap().channel();
        let (server, channel) = (&server, &channel);
        within(&main, Duration::from_secs(5), || async move {
            common::subscribers(server, channel).await == 1
        })
    };

    let rt1 = runtime();
    let _on_x = rt1.spawn({
        let c = waiting.clone();
        async move { c.acquire("x", long()).await.map(drop) }
    });
    assert!(subscribed("x"), "the first waiter never subscribed");
    let rt2 = runtime();
    let on_y = rt2.spawn({
        let c = waiting.clone();
        async move { c.acquire("y", long()).await.map(drop) }
    });
    assert!(subscribed("y"), "the second waiter never subscribed");
    drop(rt1);

    main.block_on(y.release()).unwrap();
    let woken = rt2.block_on(async { tokio::time::timeout(Duration::from_secs(2), on_y).await });
    assert!(
        matches!(woken, Ok(Ok(Ok(())))),
        "the waiter on the living runtime was not woken by the release: {woken:?}"
    );
    main.block_on(x.release()).unwrap();
}
