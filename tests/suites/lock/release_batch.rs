//! `release.lua` given a batch acts as its entries called one at a time: the same
//! replies, the same keys left, the same messages published, whatever the batch holds:
//! grants released, expired or taken over, a key of another type, waiters with or
//! without a line, the same grant twice.

use std::time::Duration;

use crate::common;
use futures_util::StreamExt;
use lock_tests::RedisServer;
use redis::Value;

/// What one lock is before the releases.
#[derive(Clone, Copy, Debug)]
enum Lock {
    /// Held by grant `c<n>:s:<lock>`.
    Held(u8),
    Missing,
    /// The lock's key holds a hash.
    OtherType,
}

/// The key of lock `j` of `side` in `round`.
fn lock_key(round: usize, side: &str, j: usize) -> String {
    format!("lock:{{r{round}:{side}:{j}}}")
}

/// Sets up `locks` (with their waiter markers and line heads) on `side`.
async fn set_up(
    conn: &mut redis::aio::MultiplexedConnection,
    round: usize,
    side: &str,
    locks: &[(Lock, bool, Option<&str>)],
) {
    let mut pipe = redis::pipe();
    for (j, (lock, marked, head)) in locks.iter().enumerate() {
        let key = lock_key(round, side, j);
        match lock {
            Lock::Held(n) => pipe.cmd("SET").arg(&key).arg(format!("c{n}:s:{j}")),
            Lock::Missing => pipe.cmd("DEL").arg(&key),
            Lock::OtherType => pipe.cmd("HSET").arg(&key).arg("f").arg("v"),
        };
        if *marked {
            pipe.cmd("SET").arg(format!("{key}:waiters")).arg("1");
        }
        if let Some(head) = head {
            pipe.cmd("RPUSH").arg(format!("{key}:queue")).arg(*head);
        }
    }
    pipe.exec_async(conn).await.unwrap();
}

/// Releases `entries` (lock, grant value) of `side` with one call of `script`, its keys
/// a column at a time: every lock, then every marker, then every line.
async fn release(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    round: usize,
    side: &str,
    entries: &[(usize, String)],
) -> Value {
    let mut call = script.prepare_invoke();
    for suffix in ["", ":waiters", ":queue"] {
        for (j, _) in entries {
            call.key(format!("{}{suffix}", lock_key(round, side, *j)));
        }
    }
    for (_, value) in entries {
        call.arg(value);
    }
    call.invoke_async(conn).await.unwrap()
}

/// Every key of `side` in `round` after the releases: the lock's type and value, the
/// marker's and the line's presence.
async fn left(
    conn: &mut redis::aio::MultiplexedConnection,
    round: usize,
    side: &str,
    locks: usize,
) -> Vec<(String, Option<String>, bool, bool)> {
    let mut out = Vec::new();
    for j in 0..locks {
        let key = lock_key(round, side, j);
        let (kind, marker, line): (String, bool, bool) = redis::pipe()
            .cmd("TYPE")
            .arg(&key)
            .cmd("EXISTS")
            .arg(format!("{key}:waiters"))
            .cmd("EXISTS")
            .arg(format!("{key}:queue"))
            .query_async(conn)
            .await
            .unwrap();
        let value = if kind == "string" {
            redis::cmd("GET").arg(&key).query_async(conn).await.unwrap()
        } else {
            None
        };
        out.push((kind, value, marker, line));
    }
    out
}

/// The messages published since the last call, as (channel, payload), with `side`
/// written as "side": read up to a sentinel published now.
async fn published(
    conn: &mut redis::aio::MultiplexedConnection,
    messages: &mut (impl futures_util::Stream<Item = redis::Msg> + Unpin),
    side: &str,
) -> Vec<(String, String)> {
    let _: i64 = redis::cmd("PUBLISH")
        .arg("sentinel")
        .arg("")
        .query_async(conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .expect("the sentinel within 5 s")
            .expect("the subscription stays open");
        let channel = msg.get_channel_name().to_owned();
        if channel == "sentinel" {
            return out;
        }
        let payload: String = msg.get_payload().unwrap();
        out.push((channel.replace(side, "side"), payload));
    }
}

#[tokio::test]
async fn a_batch_of_releases_acts_as_its_entries_called_one_by_one() {
    let server = RedisServer::start();
    let mut conn = server.connection().await;
    let script = redis::Script::new(common::script_source("release.lua"));
    let mut pubsub = server.client().get_async_pubsub().await.unwrap();
    pubsub.psubscribe("*").await.unwrap();
    let mut messages = pubsub.into_on_message();
    let mut rng = fastrand::Rng::with_seed(31);
    let (mut released, mut twice, mut woken) = (0, 0, 0);
    for round in 0..300 {
        let locks: Vec<(Lock, bool, Option<&str>)> = (0..rng.usize(1..5))
            .map(|_| {
                let lock = match rng.u8(..6) {
                    0 => Lock::Missing,
                    1 => Lock::OtherType,
                    2 => Lock::Held(2),
                    _ => Lock::Held(1),
                };
                let head = [None, Some("c7"), Some("c8")][rng.usize(..3)];
                (lock, rng.bool(), head)
            })
            .collect();
        // Mostly grant 1's releases, now and then another grant's; a lock may come twice.
        let entries: Vec<(usize, String)> = (0..rng.usize(1..8))
            .map(|_| {
                let j = rng.usize(..locks.len());
                let n = if rng.u8(..5) == 0 { 2 } else { 1 };
                (j, format!("c{n}:s:{j}"))
            })
            .collect();
        for side in ["batch", "alone"] {
            set_up(&mut conn, round, side, &locks).await;
        }

        let batch = release(&mut conn, &script, round, "batch", &entries).await;
        let batch_messages = published(&mut conn, &mut messages, "batch").await;
        let mut alone = Vec::new();
        for entry in &entries {
            alone.push(
                release(
                    &mut conn,
                    &script,
                    round,
                    "alone",
                    std::slice::from_ref(entry),
                )
                .await,
            );
        }
        let alone_messages = published(&mut conn, &mut messages, "alone").await;

        let what = format!("round {round}: {locks:?}, releases {entries:?}");
        let batch = match batch {
            Value::Array(replies) if entries.len() > 1 => replies,
            one => vec![one],
        };
        assert_eq!(batch, alone, "replies, {what}");
        assert_eq!(batch_messages, alone_messages, "messages, {what}");
        assert_eq!(
            left(&mut conn, round, "batch", locks.len()).await,
            left(&mut conn, round, "alone", locks.len()).await,
            "keys left, {what}"
        );
        released += alone.iter().filter(|r| **r == Value::Int(1)).count();
        let mut seen = std::collections::HashSet::new();
        twice += entries
            .iter()
            .filter(|(j, v)| matches!(locks[*j].0, Lock::Held(1)) && v.starts_with("c1"))
            .filter(|e| !seen.insert((*e).clone()))
            .count();
        woken += alone_messages.len();
    }
    // The rounds covered what they are for.
    assert!(
        released > 200 && twice > 30 && woken > 100,
        "{released} released, {twice} grants given back twice, {woken} messages"
    );
}
