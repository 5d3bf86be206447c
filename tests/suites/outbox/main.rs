//! A client's memory while Redis reads nothing: a connection whose write has stalled
//! for twice the command timeout ends, and what waited to be sent goes with it; and
//! after a large reply, which the connection does not keep room for. A binary of its
//! own: it counts the process's live heap, which tests running beside it would
//! disturb (its own take turns).

// The counting allocator below is the one use of `unsafe` here: a `GlobalAlloc`
// forwarding to the system allocator.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lock_core::{Begin, LockClient, LockConfig};
use lock_tests::RedisServer;

/// The system allocator, counting the bytes it has handed out and not got back.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, size) };
        if !q.is_null() {
            LIVE.fetch_add(size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1024 * 1024;

/// Held by each test for its whole run: the heap counted is the process's.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn live_mib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / MIB as f64
}

/// 32 responses of 1 MiB completed while Redis is paused: each call fails with its
/// timeout, and the client then holds no more than a few MiB of them (the socket's
/// buffers take some), not all 32 until the server reads again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_leaves_no_unsent_calls_in_memory() {
    let _alone = ALONE.lock().await;
    const CALLS: usize = 32;
    let server = RedisServer::start();
    let config = LockConfig::new().with_command_timeout(Duration::from_millis(300));
    let client = LockClient::open_with_config(server.url(), config)
        .await
        .unwrap();
    let store = client.idempotency_store("outbox");
    let mut claims = Vec::new();
    for i in 0..CALLS {
        match store
            .begin(("k", i), "fp", Duration::from_secs(60))
            .await
            .unwrap()
        {
            Begin::New(claim) => claims.push(claim),
            other => panic!("a fresh key was not claimed: {other:?}"),
        }
    }
    let before = live_mib();
    server.pause();
    let completes: Vec<_> = claims
        .into_iter()
        .map(|claim| {
            tokio::spawn(async move {
                claim
                    .complete(&vec![b'x'; MIB], Duration::from_secs(60))
                    .await
            })
        })
        .collect();
    for c in completes {
        let e = c.await.unwrap().unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
    }
    // The stalled write ends its connection two command timeouts after it began.
    let limit = before + 8.0;
    let start = Instant::now();
    while live_mib() > limit && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = live_mib();
    server.resume();
    assert!(
        held <= limit,
        "{held:.1} MiB live with the server paused, {before:.1} before the calls"
    );
    // And the client works again once the server does.
    let start = Instant::now();
    loop {
        match client.try_lock("after").await {
            Ok(_) => break,
            Err(e) if start.elapsed() < Duration::from_secs(10) => {
                assert!(e.is_unavailable(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the client did not recover: {e}"),
        }
    }
}

/// A 16 MiB record read back: once the reply is handed out, the connection keeps no
/// buffer of its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_reply_read_leaves_no_large_buffer() {
    let _alone = ALONE.lock().await;
    let server = RedisServer::start();
    let client = LockClient::open(server.url()).await.unwrap();
    let store = client.idempotency_store("large");
    let Begin::New(claim) = store
        .begin("k", "fp", Duration::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("a fresh key was not claimed");
    };
    claim
        .complete(&vec![b'x'; 16 * MIB], Duration::from_secs(60))
        .await
        .unwrap();
    // Warm: the connection and its buffers at their usual size.
    client
        .try_lock("warm")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = live_mib();
    match store
        .begin("k", "fp", Duration::from_secs(60))
        .await
        .unwrap()
    {
        Begin::Completed(record) => assert_eq!(record.len(), 16 * MIB),
        other => panic!("the completed key was not replayed: {other:?}"),
    }
    client
        .try_lock("after")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = live_mib();
    assert!(
        held <= before + 2.0,
        "{held:.1} MiB live after the record was dropped, {before:.1} before reading it"
    );
}
