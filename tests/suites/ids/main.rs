//! Order ids across OS processes (the `id-worker` binary) on a real redis-server: 2
//! processes x 200 000 ids, per id and in segment mode, all unique and each process's
//! strictly increasing; a process killed mid-run (SIGKILL) and started again repeats
//! nothing; the day's 32-bit sequence running out is an error, never a duplicate; a
//! block reservation started on a runtime that then ended still serves the next one.

#[path = "../common/mod.rs"]
mod common;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_core::LockConfig;
use lock_core::OrderId;
use lock_core::ids::{IdConfig, IdGenerator, IdMode};
use lock_tests::{RedisServer, TcpProxy};
use redis::AsyncCommands;

const PER_PROCESS: u64 = 200_000;
/// Small blocks, so the two processes' reservations interleave a few hundred times.
const BLOCK: u32 = 1_000;

/// One `next_id` call of a worker.
#[derive(Debug, Clone, Copy)]
struct Call {
    task: u32,
    id: u64,
    start: u64,
    end: u64,
}

fn spawn_worker(server: &RedisServer, name: &str, mode: &str, count: u64, tasks: u32) -> Child {
    Command::new(env!("CARGO_BIN_EXE_id-worker"))
        .args([
            &server.url(),
            name,
            mode,
            &count.to_string(),
            &tasks.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn id-worker")
}

/// A complete `<task> <id> <start> <end>` line.
fn parse_line(line: &str) -> Option<Call> {
    let mut f = line.split(' ').map(|x| x.parse::<u64>());
    let mut next = || f.next()?.ok();
    Some(Call {
        task: next()? as u32,
        id: next()?,
        start: next()?,
        end: next()?,
    })
}

/// Waits for a worker and returns its calls; it must have done `count`.
async fn finish(child: Child, count: u64) -> Vec<Call> {
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .expect("id-worker output");
    assert!(out.status.success(), "id-worker failed: {:?}", out.status);
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let done = lines.next_back().expect("output");
    let calls: Vec<Call> = lines
        .map(|l| parse_line(l).unwrap_or_else(|| panic!("bad line {l:?}")))
        .collect();
    assert_eq!(done, format!("done {count}"));
    assert_eq!(calls.len() as u64, count);
    calls
}

/// Reads a worker's calls until `at_least` have been printed, then kills it with SIGKILL
/// and returns every complete line it printed.
async fn kill_after(mut child: Child, at_least: usize) -> Vec<Call> {
    tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut calls = Vec::new();
        let mut line = String::new();
        while calls.len() < at_least {
            line.clear();
            let n = reader.read_line(&mut line).expect("read id-worker");
            assert!(n > 0, "id-worker ended early after {} ids", calls.len());
            calls.push(parse_line(line.trim_end()).expect("an id line"));
        }
        child.kill().expect("SIGKILL id-worker");
        let status = child.wait().expect("wait id-worker");
        assert!(!status.success(), "killed, not finished: {status:?}");
        // Whatever it printed before dying; a torn last line is dropped.
        let mut rest = String::new();
        reader.read_to_string(&mut rest).expect("read the rest");
        for l in rest.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            calls.push(parse_line(l.trim_end()).expect("an id line"));
        }
        calls
    })
    .await
    .unwrap()
}

/// Each task's ids strictly increase, and across tasks, an id returned before another
/// call started is smaller than that call's id.
fn assert_process_order(calls: &[Call], who: &str) {
    let mut last_of_task: HashMap<u32, u64> = HashMap::new();
    for c in calls {
        if let Some(prev) = last_of_task.insert(c.task, c.id) {
            assert!(
                c.id > prev,
                "{who}: task {} got {} after {prev}",
                c.task,
                c.id
            );
        }
    }
    let mut by_end: Vec<(u64, u64)> = calls.iter().map(|c| (c.end, c.id)).collect();
    by_end.sort_unstable();
    let mut max_so_far = Vec::with_capacity(by_end.len());
    let mut max = 0;
    for &(_, id) in &by_end {
        max = max.max(id);
        max_so_far.push(max);
    }
    for c in calls {
        let before = by_end.partition_point(|&(end, _)| end < c.start);
        if before > 0 {
            assert!(
                max_so_far[before - 1] < c.id,
                "{who}: id {} is not above {} returned before the call started",
                c.id,
                max_so_far[before - 1]
            );
        }
    }
}

fn assert_all_unique<'a>(runs: impl IntoIterator<Item = &'a [Call]>) -> usize {
    let mut seen = HashSet::new();
    let mut n = 0;
    for calls in runs {
        for c in calls {
            assert!(seen.insert(c.id), "duplicate id {}", c.id);
            n += 1;
        }
    }
    n
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Every id decodes to a time in `[from, to]` and a sequence of at least 1; returns the
/// sum of the counters of the days they came from.
async fn check_decoding(
    server: &RedisServer,
    name: &str,
    ids: impl IntoIterator<Item = u64>,
    from: u64,
    to: u64,
) -> u64 {
    let client = common::client(server, LockConfig::new()).await;
    let generator = IdGenerator::new(&client, name, IdConfig::new()).unwrap();
    let mut day_keys = HashSet::new();
    for raw in ids {
        let id = OrderId::from_raw(raw).expect("sign bit clear");
        let d = generator.decode(id);
        assert!(
            (from..=to).contains(&d.unix_seconds),
            "{id} decodes to second {}, outside the run [{from}, {to}]",
            d.unix_seconds
        );
        assert!(d.sequence >= 1);
        assert_eq!(
            OrderId::from_parts(d.seconds_since_epoch, d.sequence),
            Some(id)
        );
        day_keys.insert(generator.day_key(id));
    }
    let mut conn = server.connection().await;
    let mut total = 0;
    for key in day_keys {
        let n: u64 = conn.get(&key).await.expect("GET day counter");
        let ttl: i64 = conn.ttl(&key).await.expect("TTL");
        assert!(ttl > 0, "{key} has no expiry ({ttl})");
        total += n;
    }
    total
}

async fn two_processes(mode: &str, tasks: u32) -> (RedisServer, u64, u64) {
    let server = RedisServer::start();
    let from = unix_now();
    let workers = [
        spawn_worker(&server, "order", mode, PER_PROCESS, tasks),
        spawn_worker(&server, "order", mode, PER_PROCESS, tasks),
    ];
    let mut runs = Vec::new();
    for (i, w) in workers.into_iter().enumerate() {
        let calls = finish(w, PER_PROCESS).await;
        assert_process_order(&calls, &format!("process {i}"));
        runs.push(calls);
    }
    let to = unix_now();
    let issued = assert_all_unique(runs.iter().map(Vec::as_slice)) as u64;
    assert_eq!(issued, 2 * PER_PROCESS);
    let ids = runs.iter().flatten().map(|c| c.id);
    let counted = check_decoding(&server, "order", ids, from, to).await;
    (server, issued, counted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_per_id_mode() {
    let (_server, issued, counted) = two_processes("per-id", 16).await;
    // One INCR per id: the day counters count exactly the ids, nothing is wasted.
    assert_eq!(counted, issued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_segment_mode() {
    let (_server, issued, counted) = two_processes(&format!("segment:{BLOCK}"), 8).await;
    // Each process ends holding at most one block of unissued numbers.
    assert!(counted >= issued);
    assert!(
        counted - issued <= 2 * u64::from(BLOCK),
        "{} numbers reserved but not issued",
        counted - issued
    );
}

/// A process killed mid-run and started again under the same name, while another keeps
/// going: no id repeats, and the restarted process's ids are above the killed one's.
async fn restart_mid_run(mode: &str, count: u64) {
    let server = RedisServer::start();
    let from = unix_now();
    let steady = spawn_worker(&server, "order", mode, count, 4);
    let doomed = spawn_worker(&server, "order", mode, 0, 4);
    let before = kill_after(doomed, count as usize / 2).await;
    let again = spawn_worker(&server, "order", mode, count / 2, 4);
    let after = finish(again, count / 2).await;
    let steady = finish(steady, count).await;
    let to = unix_now();
    assert_process_order(&before, "killed process");
    assert_process_order(&after, "restarted process");
    assert_process_order(&steady, "steady process");
    let n = assert_all_unique([&before[..], &after[..], &steady[..]]);
    assert!(n as u64 >= 2 * count);
    let max_before = before.iter().map(|c| c.id).max().unwrap();
    let min_after = after.iter().map(|c| c.id).min().unwrap();
    assert!(
        min_after > max_before,
        "restarted process issued {min_after}, below the killed one's {max_before}"
    );
    let ids = [&before, &after, &steady]
        .into_iter()
        .flatten()
        .map(|c| c.id);
    check_decoding(&server, "order", ids, from, to).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_and_restarted_process_repeats_nothing_segment_mode() {
    restart_mid_run(&format!("segment:{BLOCK}"), PER_PROCESS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_and_restarted_process_repeats_nothing_per_id_mode() {
    restart_mid_run("per-id", 20_000).await;
}

/// Sets the counter of `id`'s day so that only `left` sequence numbers remain.
async fn leave_only(
    server: &RedisServer,
    generator: &IdGenerator,
    id: OrderId,
    left: u32,
) -> String {
    let key = generator.day_key(id);
    let mut conn = server.connection().await;
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(u64::from(u32::MAX - left))
        .arg("KEEPTTL")
        .query_async(&mut conn)
        .await
        .unwrap();
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_used_up_day_is_an_error_never_a_duplicate() {
    let server = RedisServer::start();
    let client = common::client(&server, LockConfig::new()).await;
    for mode in [IdMode::PerId, IdMode::Segment { block: 10 }] {
        // Retried once should midnight pass in between (a new day has a fresh counter).
        for attempt in 0.. {
            let name = format!("exhaust-{mode:?}-{attempt}");
            let generator =
                IdGenerator::new(&client, name.as_str(), IdConfig::new().with_mode(mode)).unwrap();
            let first = generator.next_id().await.unwrap();
            // Segment mode holds the rest of its first block: use a fresh generator.
            let generator =
                IdGenerator::new(&client, name.as_str(), IdConfig::new().with_mode(mode)).unwrap();
            let key = leave_only(&server, &generator, first, 3).await;
            let mut got = Vec::new();
            let err = loop {
                match generator.next_id().await {
                    Ok(id) => got.push(id),
                    Err(e) => break e,
                }
                assert!(
                    got.len() <= 3,
                    "{mode:?}: more ids than numbers left: {got:?}"
                );
            };
            if got.iter().any(|id| generator.day_key(*id) != key) {
                assert_eq!(attempt, 0, "midnight passed twice?");
                continue;
            }
            assert!(err.is_ids_unavailable(), "{mode:?}: {err:?}");
            assert!(err.to_string().contains("used up"), "{err}");
            let seqs: Vec<u32> = got.iter().map(|id| id.sequence()).collect();
            assert_eq!(seqs, [u32::MAX - 2, u32::MAX - 1, u32::MAX], "{mode:?}");
            // And it stays refused: no wrap to small numbers.
            let again = generator.next_id().await.unwrap_err();
            assert!(again.is_ids_unavailable());
            break;
        }
    }
}

/// A block reservation in flight when its runtime ended (the server had not answered):
/// the generator is not left waiting for it on the next runtime.
#[test]
fn a_reservation_whose_runtime_ended_still_serves_the_next_runtime() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.port());
    let rt1 = common::runtime();
    let client = rt1
        .block_on(lock_core::LockClient::open_with_config(
            proxy.url().as_str(),
            LockConfig::new().with_command_timeout(Duration::from_secs(5)),
        ))
        .unwrap();
    let ids = IdGenerator::new(
        &client,
        "cut-off",
        IdConfig::new().with_mode(IdMode::segment()),
    )
    .unwrap();
    proxy.cut();
    // The first id starts the reservation of a block, which hangs on the cut connection.
    let first = rt1
        .block_on(async { tokio::time::timeout(Duration::from_millis(200), ids.next_id()).await });
    assert!(first.is_err(), "an id without a block: {first:?}");
    drop(rt1);
    proxy.heal();

    let rt2 = common::runtime();
    let next = rt2.block_on(async {
        let mut last = None;
        for _ in 0..3 {
            match tokio::time::timeout(Duration::from_secs(10), ids.next_id()).await {
                Ok(Ok(id)) => return Ok(id),
                Ok(Err(e)) => last = Some(e.to_string()),
                Err(_) => return Err("next_id waited 10 s for a reservation that died".to_owned()),
            }
        }
        Err(format!("next_id kept failing: {last:?}"))
    });
    next.unwrap();
}
