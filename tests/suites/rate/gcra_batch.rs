//! `gcra.lua` given a batch decides each entry as if called alone, in order, against a
//! model: entries on one key see each other's effect, each entry's quota is its own
//! (a batch may mix limiters), a peek counts nothing, a key of another type fails its
//! entry alone, and each counted key keeps its theoretical arrival time for as long as
//! it matters.

use lock_tests::RedisServer;
use redis::Value;

use crate::common;

/// One decision: key index, emission interval (microseconds), burst, cost.
#[derive(Clone, Copy, Debug)]
struct Entry {
    key: usize,
    interval: i64,
    burst: i64,
    cost: i64,
}

/// What the model expects of one entry.
#[derive(Debug, PartialEq)]
enum Reply {
    Backlog(i64),
    Error,
}

/// The model: every key starts empty (its arrival time is the batch's `now`), and one
/// call runs at one `now`, so each reply is the key's backlog, known without a clock.
fn model(entries: &[Entry], other_type: &[bool]) -> (Vec<Reply>, Vec<i64>) {
    let mut backlog = vec![0i64; other_type.len()];
    let replies = entries
        .iter()
        .map(|e| {
            if other_type[e.key] {
                return Reply::Error;
            }
            let b = backlog[e.key];
            if b + e.interval * e.cost.max(1) > e.interval * e.burst {
                Reply::Backlog(-1 - b)
            } else {
                backlog[e.key] += e.interval * e.cost;
                Reply::Backlog(b)
            }
        })
        .collect();
    (replies, backlog)
}

/// The server's clock in microseconds.
async fn server_time(conn: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    secs * 1_000_000 + micros
}

fn key(round: usize, j: usize) -> String {
    format!("gcra:{{r{round}}}:{j}")
}

#[tokio::test]
async fn a_batch_of_decisions_acts_as_its_entries_in_order() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let script = redis::Script::new(common::script_source("gcra.lua"));
    let mut rng = fastrand::Rng::with_seed(17);
    let quotas = [(7, 1), (1_000, 3), (250_000, 2), (40_000, 5)];
    let (mut refused, mut mixed, mut errors) = (0, 0, 0);
    for round in 0..300 {
        let keys = rng.usize(1..4);
        let other_type: Vec<bool> = (0..keys).map(|_| rng.u8(..8) == 0).collect();
        for (j, other) in other_type.iter().enumerate() {
            if *other {
                let _: () = redis::cmd("HSET")
                    .arg(key(round, j))
                    .arg("f")
                    .arg("v")
                    .query_async(&mut conn)
                    .await
                    .unwrap();
            }
        }
        // Runs of one quota, now and then another: the script parses a quota string
        // only when it differs from the entry before.
        let mut quota = quotas[rng.usize(..quotas.len())];
        let entries: Vec<Entry> = (0..rng.usize(1..10))
            .map(|_| {
                if rng.u8(..4) == 0 {
                    quota = quotas[rng.usize(..quotas.len())];
                }
                Entry {
                    key: rng.usize(..keys),
                    interval: quota.0,
                    burst: quota.1,
                    cost: [0, 1, 1, 2, 3][rng.usize(..5)],
                }
            })
            .collect();

        let before = server_time(&mut conn).await;
        let sent = std::time::Instant::now();
        let mut call = script.prepare_invoke();
        for e in &entries {
            call.key(key(round, e.key));
        }
        for e in &entries {
            call.arg(e.interval).arg(e.burst).arg(e.cost);
        }
        let reply: Value = call.invoke_async(&mut conn).await.unwrap();
        let replies = match reply {
            Value::Array(replies) if entries.len() > 1 => replies,
            one => vec![one],
        };
        let got: Vec<Reply> = replies
            .iter()
            .map(|r| match r {
                Value::Int(n) => Reply::Backlog(*n),
                Value::Array(e) if e.first() == Some(&Value::BulkString(b"error".to_vec())) => {
                    Reply::Error
                }
                other => panic!("round {round}: unexpected entry reply {other:?}"),
            })
            .collect();
        let (expected, backlog) = model(&entries, &other_type);
        let what = format!("round {round}: {entries:?}, other type {other_type:?}");
        assert_eq!(got, expected, "replies, {what}");

        // A counted key holds its arrival time, the call's `now` plus its backlog, for its
        // backlog in whole milliseconds plus one; an uncounted one was never written. A
        // short-lived key may be gone by the time it is read, but only once its time is up.
        let after = server_time(&mut conn).await;
        for (j, b) in backlog.iter().enumerate().filter(|(j, _)| !other_type[*j]) {
            let (tat, pttl): (Option<i64>, i64) = redis::pipe()
                .cmd("GET")
                .arg(key(round, j))
                .cmd("PTTL")
                .arg(key(round, j))
                .query_async(&mut conn)
                .await
                .unwrap();
            let elapsed = sent.elapsed().as_millis() as i64;
            // Every interval is positive: a key counted at least once has a backlog.
            let counted = *b > 0;
            let ttl = (b + 999) / 1000 + 1;
            match tat {
                None if !counted => assert_eq!(pttl, -2, "key {j} untouched, {what}"),
                None => assert!(
                    elapsed >= ttl - 1,
                    "key {j} gone after {elapsed} ms of {ttl}, {what}"
                ),
                Some(_) if !counted => panic!("key {j} written, {what}"),
                Some(tat) => {
                    assert!(
                        (before..=after).contains(&(tat - b)),
                        "key {j}: arrival time {tat}, backlog {b}, call between {before} and {after}, {what}"
                    );
                    assert!(
                        pttl <= ttl && pttl >= ttl - elapsed - 1,
                        "key {j}: PTTL {pttl} after {elapsed} ms, expected {ttl}, {what}"
                    );
                }
            }
        }
        refused += expected
            .iter()
            .filter(|r| matches!(r, Reply::Backlog(n) if *n < 0))
            .count();
        mixed += usize::from(
            entries
                .windows(2)
                .any(|w| (w[0].interval, w[0].burst) != (w[1].interval, w[1].burst)),
        );
        errors += expected.iter().filter(|r| **r == Reply::Error).count();
    }
    // The rounds covered what they are for.
    assert!(
        refused > 100 && mixed > 60 && errors > 20,
        "{refused} refused, {mixed} batches mixing quotas, {errors} entries on another type"
    );
}
