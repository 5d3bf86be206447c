//! Read-write locks in the layout of the Go `recipe.RWMutex` (etcd's
//! `client/v3/experimental/recipes`): a key per hold under `<lock>/read/` or
//! `<lock>/write/`, made under a session lease; a writer waits for every older key, a
//! reader for older writers only. Contenders made by hand as the Go package makes them
//! are honoured by ours, and ours are what a Go client reads.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::checks;
use lock_core::LockOptions;
use lock_core::etcd_client::{self as etcd, GetOptions, SortOrder, SortTarget};

use super::{go_put, locks, raw, shared};

/// A Go contender's key under `<prefix>/<kind>/` (`read` or `write`), as
/// `newUniqueEphemeralKey` makes it: its key and create revision.
async fn go_key(client: &etcd::Client, prefix: &str, kind: &str) -> (String, i64) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let (key, _, created) = go_put(client, |_| format!("{prefix}/{kind}/{nanos}"), "").await;
    (key, created)
}

/// What the Go package's `waitOnLastRev` reads for a key of revision `rev` waiting on
/// the keys of `blockers`: the newest of them older than it, if any.
async fn go_blocked(client: &etcd::Client, blockers: &str, rev: i64) -> bool {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Mod, SortOrder::Descend)
        .with_limit(1)
        .with_max_mod_revision(rev - 1);
    let answer = client
        .kv_client()
        .get(blockers, Some(options))
        .await
        .unwrap();
    !answer.kvs().is_empty()
}

/// Keys under `prefix` now.
async fn keys(client: &etcd::Client, prefix: &str) -> Vec<String> {
    let answer = client
        .kv_client()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .unwrap();
    answer
        .kvs()
        .iter()
        .map(|kv| kv.key_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_writer_excludes_us_and_wakes_our_reader() {
    let cluster = shared();
    let locks = locks(cluster, "rw-go-writer").await;
    let prefix = locks.lock_prefix("catalog").unwrap();
    let go = raw(cluster).await;
    let (writer, _) = go_key(&go, &prefix, "write").await;

    checks::read_and_write_busy(&locks, "catalog").await;
    let reader = checks::waiting(&locks, "catalog", LockOptions::new().read());
    crate::common::eventually(Duration::from_secs(5), "our reader queued", || async {
        !keys(&go, &format!("{prefix}/read/")).await.is_empty()
    })
    .await;
    assert!(!reader.is_finished(), "granted beside a Go writer");
    go.kv_client().delete(writer.as_str(), None).await.unwrap();
    let g = checks::granted(reader, "woken by the writer's deletion").await;
    assert!(g.is_held());
    assert!(g.fencing_token().is_none(), "readers are not fenced");
    g.release().await.unwrap();
    assert!(keys(&go, &format!("{prefix}/")).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_reader_shares_with_ours_and_our_waiting_writer_holds_go_readers_back() {
    let cluster = shared();
    let locks = locks(cluster, "rw-go-reader").await;
    let prefix = locks.lock_prefix("catalog").unwrap();
    let go = raw(cluster).await;
    let (go_reader, _) = go_key(&go, &prefix, "read").await;

    checks::a_reader_shares_and_the_writer_is_busy(&locks, "catalog").await;

    let writer = checks::waiting(&locks, "catalog", LockOptions::new().write());
    let writers = format!("{prefix}/write/");
    crate::common::eventually(Duration::from_secs(5), "our writer queued", || async {
        !keys(&go, &writers).await.is_empty()
    })
    .await;
    // A Go reader that comes now waits for our writer, by the Go package's own read.
    let (late, late_rev) = go_key(&go, &prefix, "read").await;
    assert!(go_blocked(&go, &format!("{prefix}/write"), late_rev).await);
    go.kv_client().delete(late.as_str(), None).await.unwrap();

    assert!(!writer.is_finished(), "granted beside a Go reader");
    go.kv_client()
        .delete(go_reader.as_str(), None)
        .await
        .unwrap();
    let w = checks::granted(writer, "woken by the reader's deletion").await;
    assert!(
        w.fencing_token().is_some(),
        "a writer is fenced by its key's revision"
    );
    // While ours writes, a Go reader waits; once it is gone, it reads.
    let (blocked, rev) = go_key(&go, &prefix, "read").await;
    assert!(go_blocked(&go, &format!("{prefix}/write"), rev).await);
    w.release().await.unwrap();
    assert!(!go_blocked(&go, &format!("{prefix}/write"), rev).await);
    go.kv_client().delete(blocked.as_str(), None).await.unwrap();
}
