//! GCRA rate limiting and the seed's LimitRule on real Redis.

#[path = "../common/mod.rs"]
mod common;
mod gcra_batch;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, eventually, exists};
use lock_core::{LimitRule, LockConfig, RateLimit};
use lock_tests::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn burst_then_throttle_then_the_steady_rate() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    // 20 per second (one per 50 ms), 5 at once.
    let limiter = c.rate_limiter("api", RateLimit::per_second(20).with_burst(5));
    for i in 0..5 {
        let d = limiter.check("alice").await.unwrap();
        assert!(d.allowed, "burst request {i}");
        assert_eq!(d.remaining, 4 - i);
    }
    let refused = limiter.check("alice").await.unwrap();
    assert!(!refused.allowed);
    let retry = refused.retry_after.unwrap();
    assert!(retry <= Duration::from_millis(50), "{retry:?}");
    assert!(
        refused.reset_after > Duration::from_millis(200),
        "{refused:?}"
    );
    // Other keys have their own quota.
    assert!(limiter.check("bob").await.unwrap().allowed);

    // Steady state: attempts every 5 ms for 3 s admit one per 50 ms.
    let start = Instant::now();
    let mut admitted = 0;
    while start.elapsed() < Duration::from_secs(3) {
        if limiter.check("alice").await.unwrap().allowed {
            admitted += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        (59..=61).contains(&admitted),
        "admitted {admitted} in 3 s at 20/s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_accurate_to_20ms() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    // One per 400 ms, no burst beyond one.
    let limiter = c.rate_limiter(
        "sms",
        RateLimit::new(5, Duration::from_secs(2)).with_burst(1),
    );
    assert!(limiter.check("+4912345").await.unwrap().allowed);
    let refused = limiter.check("+4912345").await.unwrap();
    let asked = Instant::now();
    let retry = refused.retry_after.expect("refused");
    assert!(retry > Duration::from_millis(300), "{retry:?}");
    tokio::time::sleep_until((asked + retry - Duration::from_millis(20)).into()).await;
    let early = limiter.peek("+4912345").await.unwrap();
    assert!(
        early.remaining == 0,
        "fits 20 ms before retry_after: {early:?}"
    );
    tokio::time::sleep_until((asked + retry + Duration::from_millis(20)).into()).await;
    assert!(
        limiter.check("+4912345").await.unwrap().allowed,
        "refused 20 ms after retry_after"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_peek_and_reset() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let limiter = c.rate_limiter("bulk", RateLimit::per_minute(10));
    let d = limiter.check_n("k", 7).await.unwrap();
    assert!(d.allowed && d.remaining == 3, "{d:?}");
    let peek = limiter.peek("k").await.unwrap();
    assert_eq!(peek.remaining, 3, "peek does not count");
    assert_eq!(limiter.peek("k").await.unwrap().remaining, 3);
    let d = limiter.check_n("k", 4).await.unwrap();
    assert!(!d.allowed, "{d:?}");
    assert!(
        limiter.check_n("k", 3).await.unwrap().allowed,
        "a refused cost is not counted"
    );
    assert!(
        limiter
            .check_n("k", 11)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    assert!(
        limiter
            .check_n("k", 0)
            .await
            .unwrap_err()
            .is_invalid_input()
    );
    limiter.reset("k").await.unwrap();
    assert_eq!(limiter.peek("k").await.unwrap().remaining, 10);
    let zero = c.rate_limiter("bad", RateLimit::per_second(0));
    assert!(zero.check("k").await.unwrap_err().is_invalid_input());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_one_limit() {
    let server = RedisServer::start();
    let url = server.url();
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_lock-worker"))
            .args(["rate", &url, "10.0.0.1", "50", "10", "2000"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn lock-worker")
    };
    let workers = [spawn(), spawn()];
    let mut admitted = 0;
    for w in workers {
        let out = tokio::task::spawn_blocking(move || w.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let n: u64 = text
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("unexpected output {text:?}"));
        admitted += n;
    }
    // One shared limit: a burst of 10 plus 50/s over about 2 s (the two workers start a
    // few ms apart), not twice that.
    assert!((100..=115).contains(&admitted), "admitted {admitted}");
}

/// The seed's rule: an IP may pass 5 times a second; more than 7 attempts lock it out
/// for 2 seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_limit_rule_step_by_step() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let rule = c.limit_rule("ip", LimitRule::new(1, 5).with_lockout(7, 2));
    let mut seen = Vec::new();
    for _ in 0..8 {
        let d = rule.try_access("10.0.0.1").await.unwrap();
        seen.push((d.allowed, d.count, d.locked_out));
    }
    assert_eq!(
        seen,
        [
            (true, 1, false),
            (true, 2, false),
            (true, 3, false),
            (true, 4, false),
            (true, 5, false),
            (false, 6, false), // over the limit, not yet locked out
            (false, 7, false),
            (false, 8, true), // the 8th attempt starts the lockout
        ]
    );
    let locked_at = Instant::now();
    let d = rule.try_access("10.0.0.1").await.unwrap();
    assert!(!d.allowed && d.locked_out && d.count == 0, "{d:?}");
    let retry = d.retry_after.unwrap();
    assert!(
        retry > Duration::from_millis(1800) && retry <= Duration::from_secs(2),
        "{retry:?}"
    );
    // Another IP is unaffected.
    assert!(rule.try_access("10.0.0.2").await.unwrap().allowed);

    let lockout = format!("{}:lockout", c.keys(("ip", "10.0.0.1")).unwrap().key);
    assert!(exists(&server, &lockout).await);
    eventually(Duration::from_secs(4), "the lockout to end", || async {
        !exists(&server, &lockout).await
    })
    .await;
    assert!(locked_at.elapsed() >= Duration::from_millis(1800));
    let d = rule.try_access("10.0.0.1").await.unwrap();
    assert_eq!(
        (d.allowed, d.count, d.locked_out),
        (true, 1, false),
        "a fresh window"
    );

    let bad = c.limit_rule("x", LimitRule::new(0, 5));
    assert!(bad.try_access("k").await.unwrap_err().is_invalid_input());
}

/// `peek` answers for a request of cost 1, as the next check would: with the quota
/// exhausted it says refused (a request of cost 0 would always fit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_agrees_with_the_next_check() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let limiter = c.rate_limiter("one", RateLimit::per_minute(1).with_burst(1));
    let fresh = limiter.peek("k").await.unwrap();
    assert!(fresh.allowed && fresh.remaining == 1, "{fresh:?}");
    assert!(limiter.check("k").await.unwrap().allowed);
    let peek = limiter.peek("k").await.unwrap();
    assert!(!peek.allowed, "the quota is exhausted: {peek:?}");
    assert_eq!(peek.remaining, 0);
    assert!(
        peek.retry_after
            .is_some_and(|r| r > Duration::from_secs(50))
    );
    assert!(!limiter.check("k").await.unwrap().allowed);
}

/// A quota whose spacing is not a whole number of microseconds (600 000 a second: 1.67
/// µs each) is kept, never exceeded: spending the whole burst takes at least the
/// period to recover, for every such rate tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_quota_is_never_exceeded_by_rounding() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    for rate in [600_000u32, 750_000, 150_000, 3_000, 7] {
        let limiter = c.rate_limiter(format!("bytes-{rate}"), RateLimit::per_second(rate));
        let d = limiter.check_n("k", rate).await.unwrap();
        assert!(d.allowed, "{rate}/s");
        assert!(
            d.reset_after >= Duration::from_secs(1),
            "{rate}/s: the whole burst spent, reset after {:?}",
            d.reset_after
        );
    }
}
