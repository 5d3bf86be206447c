//! Batching: concurrent calls of one script share one script call, each caller still
//! gets its own reply, and a failed batch fails each of its entries and leaves no lock.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{client, eventually, load_scripts, one_in_flight};
use lock_core::{
    Begin, Lease, LockClient, LockConfig, LockError, LockOptions, RateLimit, Released,
};
use lock_tests::{Monitor, RedisServer};

const TASKS: usize = 64;
const ROUNDS: usize = 40;

/// Commands the clients sent (not those scripts ran) from what `monitor` saw up to
/// now, by name.
pub(crate) async fn sent_since(
    server: &RedisServer,
    monitor: &mut Monitor,
) -> BTreeMap<String, u64> {
    let lines = common::seen_until_now(server, monitor).await;
    let mut by_name = BTreeMap::new();
    for l in &lines {
        if l.contains(" lua] ") || l.contains("\"ECHO\" \"end\"") {
            continue;
        }
        if let Some(name) = l.split(']').nth(1).and_then(|r| r.split('"').nth(1)) {
            let name = name.to_ascii_uppercase();
            let name = if name == "EVALSHA" {
                let sha = l
                    .split(']')
                    .nth(1)
                    .and_then(|r| r.split('"').nth(3))
                    .unwrap_or("");
                format!(
                    "EVALSHA {}",
                    lock_core::SCRIPT_SOURCES
                        .iter()
                        .find(|(_, src)| redis::Script::new(src).get_hash() == sha)
                        .map_or("?", |(n, _)| *n)
                )
            } else {
                name
            };
            *by_name.entry(name).or_insert(0) += 1;
        }
    }
    by_name
}

fn total(by_name: &BTreeMap<String, u64>) -> u64 {
    by_name.values().sum()
}

/// Script calls (`EVALSHA`, `EVAL`) among `by_name`.
pub(crate) fn script_calls(by_name: &BTreeMap<String, u64>) -> u64 {
    by_name
        .iter()
        .filter(|(name, _)| name.starts_with("EVAL"))
        .map(|(_, n)| n)
        .sum()
}

/// What 64 tasks, each on names of its own, send: lock and release, a GCRA decision, an
/// idempotency claim and its completion, `ROUNDS` times each.
struct Sent {
    /// Commands by name.
    by_name: BTreeMap<String, u64>,
    /// Operations made (five per round per task).
    operations: f64,
}

impl Sent {
    /// Script calls (`EVALSHA`, `EVAL`) per operation.
    fn scripts_per_operation(&self) -> f64 {
        script_calls(&self.by_name) as f64 / self.operations
    }

    /// Commands of any kind per operation.
    fn commands_per_operation(&self) -> f64 {
        total(&self.by_name) as f64 / self.operations
    }
}

async fn sent_by_64_tasks(batching: bool) -> Sent {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new().with_batching(batching)).await;
    let limiter = c.rate_limiter("api", RateLimit::per_second(1000).with_burst(1000));
    let store = c.idempotency_store("idem");
    load_scripts(&c).await;
    let mut monitor = server.monitor().await;
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (c, limiter, store) = (c.clone(), limiter.clone(), store.clone());
            tokio::spawn(async move {
                for r in 0..ROUNDS {
                    let g = c.try_lock(("b", t)).await.unwrap();
                    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
                    assert!(limiter.check(("user", t)).await.unwrap().allowed);
                    let Begin::New(claim) = store
                        .begin(("k", t, r), "fp", Duration::from_secs(10))
                        .await
                        .unwrap()
                    else {
                        panic!("a fresh key is claimed");
                    };
                    claim
                        .complete(b"done", Duration::from_secs(60))
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let sent = Sent {
        by_name: sent_since(&server, &mut monitor).await,
        operations: (TASKS * ROUNDS * 5) as f64,
    };
    println!(
        "batching {batching}: {:?} for {} operations = {:.3} scripts, {:.3} commands per operation",
        sent.by_name,
        sent.operations,
        sent.scripts_per_operation(),
        sent.commands_per_operation()
    );
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_form_under_64_tasks() {
    let sent = sent_by_64_tasks(true).await;
    let per_op = sent.scripts_per_operation();
    assert!(
        per_op < 0.25,
        "{per_op:.3} script calls per operation: batches did not form"
    );
    // A free lock is taken with the plain `SET NX PX` of the raw recipe, and a fresh
    // idempotency key claimed with a plain `SET NX PX GET`, queued or not: never queued
    // into a script (where the same SET costs Redis several times more).
    let sets = sent.by_name.get("SET").copied().unwrap_or(0);
    assert_eq!(sets, (2 * TASKS * ROUNDS) as u64, "{:?}", sent.by_name);
    assert_eq!(
        sent.by_name.get("EVALSHA acquire.lua"),
        None,
        "{:?}",
        sent.by_name
    );
}

/// The same count without batching is one command per operation: the count above
/// measures what it claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_batching_every_operation_is_a_command() {
    let sent = sent_by_64_tasks(false).await;
    let per_op = sent.commands_per_operation();
    assert!(
        (per_op - 1.0).abs() < 1e-9,
        "{per_op:.3} commands per operation"
    );
    // A plain SET per acquisition and per fresh idempotency claim; a script for each
    // of the three others.
    assert!(
        (sent.scripts_per_operation() - 0.6).abs() < 1e-9,
        "{:?}",
        sent.by_name
    );
}

/// Releases every guard from a task of its own, all spawned before any runs; each must
/// answer `Unlocked`.
async fn release_at_once(guards: Vec<lock_core::LockGuard>) {
    let releases: Vec<_> = guards
        .into_iter()
        .map(|g| tokio::spawn(g.release()))
        .collect();
    for r in releases {
        assert_eq!(r.await.unwrap().unwrap(), Released::Unlocked);
    }
}

/// Calls that arrive together go together. On a quiet lane the first of a wave goes
/// alone and the rest queue behind it (two calls); once calls have queued, the first to
/// find the lane idle queues too, so the next wave is one call; a batch of one makes the
/// lane quiet again. (One thread: the tasks of a wave run in turn before any driver.)
#[tokio::test]
async fn a_wave_after_a_busy_spell_goes_as_one_call() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    load_scripts(&c).await;
    let mut monitor = server.monitor().await;
    let wave = |n: usize| {
        let c = c.clone();
        async move {
            let mut guards = Vec::new();
            for i in 0..n {
                guards.push(c.try_lock(("wave", i)).await.unwrap());
            }
            release_at_once(guards).await;
        }
    };
    let release_calls =
        |sent: BTreeMap<String, u64>| sent.get("EVALSHA release.lua").copied().unwrap_or(0);
    wave(8).await;
    let quiet = release_calls(sent_since(&server, &mut monitor).await);
    wave(8).await;
    let busy = release_calls(sent_since(&server, &mut monitor).await);
    wave(1).await;
    wave(8).await;
    let quiet_again = release_calls(sent_since(&server, &mut monitor).await);
    assert_eq!(
        (quiet, busy, quiet_again),
        (2, 1, 1 + 2),
        "release calls: a wave on a quiet lane, on a busy one, then a lone one and a wave"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_task_sends_one_command_per_operation() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    load_scripts(&c).await;
    let mut monitor = server.monitor().await;
    for i in 0..200 {
        c.try_lock(("one", i % 3))
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // The plain `SET NX PX` of the raw recipe, and one release script call.
    let sent = sent_since(&server, &mut monitor).await;
    assert_eq!(sent.get("SET"), Some(&200), "{sent:?}");
    assert_eq!(sent.get("EVALSHA release.lua"), Some(&200), "{sent:?}");
    assert_eq!(total(&sent), 400, "{sent:?}");
}

/// A call alone is a batch of one, answered with its entry's reply alone: each outcome
/// still reaches its caller as it would in a batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_call_gets_each_outcome_of_its_entry() {
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    let fenced = || LockOptions::new().wait(Duration::ZERO).fenced();
    let mut raw = server.connection().await;
    let make_hash = |key: String| {
        redis::pipe()
            .cmd("DEL")
            .arg(&key)
            .cmd("HSET")
            .arg(&key)
            .arg("f")
            .arg("v")
            .clone()
    };

    // Acquisitions through the script: granted with a token, busy.
    let held = c.acquire("a", fenced()).await.unwrap();
    assert!(held.fencing_token().is_some());
    let other = client(&server, LockConfig::new()).await;
    assert!(matches!(
        other.acquire("a", fenced()).await,
        Err(LockError::Busy { .. })
    ));

    // Releases: released, expired, a key that now holds another type.
    assert!(matches!(held.release().await, Ok(Released::Unlocked)));
    let short = LockOptions::new().lease(Lease::Fixed(Duration::from_millis(50)));
    let gone = c.acquire("gone", short).await.unwrap();
    eventually(Duration::from_secs(2), "the lease to end", || async {
        !common::exists(&server, &c.keys("gone").unwrap().key).await
    })
    .await;
    assert!(matches!(
        gone.release().await,
        Err(LockError::Expired { .. })
    ));
    let odd = c.try_lock("odd").await.unwrap();
    let _: () = make_hash(c.keys("odd").unwrap().key)
        .query_async(&mut raw)
        .await
        .unwrap();
    let e = odd.release().await.unwrap_err();
    assert!(
        matches!(&e, LockError::Redis(r) if r.to_string().contains("WRONGTYPE")),
        "{e:?}"
    );
    assert_eq!(c.queued_calls(), 0, "every call went alone");
}

/// Freezes the server, starts `n` calls, waits until all but the first queued behind
/// it, and lets the server go: the queued ones go as one batch.
pub(crate) async fn in_one_batch<T: Send + 'static>(
    server: &RedisServer,
    c: &LockClient,
    calls: Vec<tokio::task::JoinHandle<T>>,
) -> Vec<T> {
    let n = calls.len();
    eventually(Duration::from_secs(5), "the calls to queue", || async {
        c.queued_calls() == n - 1
    })
    .await;
    server.resume();
    let mut out = Vec::new();
    for call in calls {
        out.push(call.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_batch_carries_mixed_outcomes_to_their_own_callers() {
    let server = RedisServer::start();
    let c = client(&server, one_in_flight()).await;
    let other = client(&server, LockConfig::new()).await;
    let busy = other.try_lock("busy").await.unwrap();
    let short = LockOptions::new().lease(Lease::Fixed(Duration::from_millis(100)));

    // Acquisitions through the script (fenced ones, and a busy lock): granted with a
    // fencing token, busy; a name refused before it reaches Redis; and a plain one
    // beside them, a SET on a lane of its own (plain commands), alone there.
    assert!(matches!(
        c.try_lock(("bad", "")).await,
        Err(LockError::InvalidKey(_))
    ));
    load_scripts(&c).await;
    let mut monitor = server.monitor().await;
    server.pause();
    let take_fenced = |name: &'static str| {
        let c = c.clone();
        let options = LockOptions::new().wait(Duration::ZERO).fenced();
        tokio::spawn(async move {
            c.acquire(name, options).await.map(|g| {
                let t = g.fencing_token();
                (g, t)
            })
        })
    };
    let plain = tokio::spawn({
        let c = c.clone();
        async move { c.try_lock("first").await }
    });
    let pending = vec![
        take_fenced("alone"),
        take_fenced("free"),
        take_fenced("busy"),
    ];
    let mut out = in_one_batch(&server, &c, pending).await.into_iter();
    let first = plain.await.unwrap().unwrap();
    let (alone, t1) = out.next().unwrap().unwrap();
    let (free, t2) = out.next().unwrap().unwrap();
    assert!(
        t1.is_some() && t2.is_some(),
        "a fenced entry gets its token"
    );
    assert!(matches!(out.next().unwrap(), Err(LockError::Busy { .. })));
    // The plain SET; the script alone; then one batch of the other two.
    let sent = sent_since(&server, &mut monitor).await;
    assert_eq!(sent.get("SET"), Some(&1), "{sent:?}");
    assert_eq!(sent.get("EVALSHA acquire.lua"), Some(&2), "{sent:?}");
    assert_eq!(total(&sent), 3, "{sent:?}");

    // Releases: released, expired, taken over, and a key that now holds another type.
    let expired = c.acquire("expired", short.clone()).await.unwrap();
    let taken = c.acquire("taken", short).await.unwrap();
    let odd = c.try_lock("odd").await.unwrap();
    let mut raw = server.connection().await;
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(c.keys("odd").unwrap().key)
        .cmd("HSET")
        .arg(c.keys("odd").unwrap().key)
        .arg("f")
        .arg("v")
        .query_async(&mut raw)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(2),
        "the short leases to end",
        || async { !expired.is_held() && !taken.is_held() },
    )
    .await;
    let newcomer = other.lock("taken").await.unwrap();
    let _ = sent_since(&server, &mut monitor).await;
    server.pause();
    let pending = vec![
        tokio::spawn(first.release()),
        tokio::spawn(free.release()),
        tokio::spawn(expired.release()),
        tokio::spawn(taken.release()),
        tokio::spawn(odd.release()),
        tokio::spawn(alone.release()),
    ];
    let out = in_one_batch(&server, &c, pending).await;
    assert!(matches!(out[0], Ok(Released::Unlocked)));
    assert!(matches!(out[1], Ok(Released::Unlocked)));
    assert!(
        matches!(out[2], Err(LockError::Expired { .. })),
        "{:?}",
        out[2]
    );
    assert!(
        matches!(out[3], Err(LockError::NotOwner { .. })),
        "{:?}",
        out[3]
    );
    assert!(matches!(out[4], Err(LockError::Redis(_))), "{:?}", out[4]);
    assert!(matches!(out[5], Ok(Released::Unlocked)));
    // (The other client's pub/sub bookkeeping may show up beside them.)
    let sent = sent_since(&server, &mut monitor).await;
    assert_eq!(
        (sent.get("EVALSHA release.lua"), script_calls(&sent)),
        (Some(&2), 2),
        "one release alone, then one batch of five: {sent:?}"
    );
    assert!(newcomer.is_held());
    drop(busy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_times_out_fails_every_entry_and_leaves_no_lock() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(300);
    let c = client(&server, one_in_flight().with_command_timeout(timeout)).await;
    // A script the server does not have yet is loaded by a second call, which a caller
    // that timed out never makes: a running service has its scripts loaded.
    load_scripts(&c).await;
    server.pause();
    // Eight through the script (fenced): one alone, seven queued behind it; and four
    // plain SETs beside them: one alone, three queued for the next pipeline.
    let calls: Vec<_> = (0..12)
        .map(|i| {
            let c = c.clone();
            tokio::spawn(async move {
                let options = LockOptions::new().wait(Duration::ZERO);
                let options = if i < 8 { options.fenced() } else { options };
                c.acquire(("t", i), options).await
            })
        })
        .collect();
    eventually(Duration::from_secs(5), "the calls to queue", || async {
        c.queued_calls() == 10
    })
    .await;
    let mut out = Vec::new();
    for call in calls {
        out.push(call.await.unwrap());
    }
    for r in &out {
        // Alone, the connection's own response timeout or ours, whichever fires
        // first: each entry gets the error a call alone would have had.
        assert!(
            matches!(r, Err(LockError::RedisTimeout { .. } | LockError::Redis(_))),
            "every entry times out: {r:?}"
        );
    }
    // The server then runs what was sent: every grant it makes is given back.
    server.resume();
    // A call on the same connection after everything sent during the pause: once it
    // is answered, the server has run all of that, and any grant it made exists until
    // given back.
    c.try_lock("after").await.unwrap().release().await.unwrap();
    for i in 0..12 {
        let key = c.keys(("t", i)).unwrap().key;
        eventually(Duration::from_secs(5), "no lock left behind", || async {
            !common::exists(&server, &key).await
        })
        .await;
    }
    assert_eq!(c.held_count(), 0);
}

/// A wave of calls that queued at once goes as several script calls, none carrying more
/// than half of it, so Redis starts on the first while the client writes the rest; each
/// caller still gets its own outcome and each entry is sent once. (One thread: the
/// wave's tasks all queue before any driver runs.)
#[tokio::test]
async fn a_large_wave_goes_in_parts_each_entry_sent_once() {
    const N: usize = 200;
    let server = RedisServer::start();
    let c = client(&server, LockConfig::new()).await;
    load_scripts(&c).await;
    let name = |i: usize| format!("part-{i}");
    let mut guards = Vec::new();
    for i in 0..N {
        guards.push(c.try_lock(name(i)).await.unwrap());
    }
    let mut monitor = server.monitor().await;
    release_at_once(guards).await;
    let release_sha = common::script_sha("release.lua");
    // The names each release call carries.
    let calls: Vec<std::collections::BTreeSet<usize>> =
        common::seen_until_now(&server, &mut monitor)
            .await
            .iter()
            .filter(|l| l.contains(&release_sha) && !l.contains(" lua] "))
            .map(|l| {
                l.split("part-")
                    .skip(1)
                    .map(|rest| {
                        let digits: String =
                            rest.chars().take_while(char::is_ascii_digit).collect();
                        digits.parse().unwrap()
                    })
                    .collect()
            })
            .collect();
    let sizes: Vec<usize> = calls.iter().map(|names| names.len()).collect();
    let mut sent: Vec<usize> = calls.iter().flatten().copied().collect();
    sent.sort_unstable();
    assert_eq!(
        sent,
        (0..N).collect::<Vec<_>>(),
        "each release sent once: {sizes:?}"
    );
    assert!(
        sizes.len() > 2 && sizes.iter().all(|&n| n <= N / 2),
        "the wave goes in parts of at most half of it: {sizes:?}"
    );
}
