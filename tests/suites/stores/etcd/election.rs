//! Election values in the layout of the Go `concurrency.Election`: a candidate's key
//! `<prefix>/<lease id in hex>` keeps its value, the leader is the oldest key, and a
//! leader's `Proclaim` replaces its value in a transaction fenced by the key's create
//! revision. A Go observer reads our leader's value; we read a Go leader's.

use std::time::Duration;

use lock_core::Election;
use lock_core::etcd_client::{self as etcd, GetOptions, SortOrder, SortTarget};

use super::{go_put, locks, raw, shared};

/// What Go's `Election.Leader` reads: the oldest key under `<prefix>/`, its value and
/// lease.
async fn go_leader(client: &etcd::Client, prefix: &str) -> Option<(String, Vec<u8>, i64)> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    let answer = client
        .kv_client()
        .get(format!("{prefix}/"), Some(options))
        .await
        .unwrap();
    answer.kvs().first().map(|kv| {
        (
            kv.key_str().unwrap().to_owned(),
            kv.value().to_vec(),
            kv.lease(),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_observer_reads_our_leaders_value_and_its_proclamation() {
    let cluster = shared();
    let locks = locks(cluster, "election-values").await;
    let prefix = locks.lock_prefix("scheduler").unwrap();
    let go = raw(cluster).await;
    let election = Election::new(locks.clone(), "scheduler").value("10.0.0.7:8080");
    let leading = election.campaign(Duration::ZERO).await.unwrap();

    let (key, value, lease) = go_leader(&go, &prefix).await.expect("a leader");
    assert_eq!(value, b"10.0.0.7:8080");
    assert_ne!(lease, 0, "the key lives under our session lease");
    let holder = locks.holder("scheduler").await.unwrap().expect("a holder");
    assert_eq!(holder.key, key);
    assert_eq!(holder.value, b"10.0.0.7:8080");
    assert_eq!(holder.token, leading.term());

    locks
        .proclaim(leading.guard(), "10.0.0.8:8080")
        .await
        .unwrap();
    let (key_after, value, lease_after) = go_leader(&go, &prefix).await.expect("a leader");
    assert_eq!((key_after, value.as_slice()), (key, &b"10.0.0.8:8080"[..]));
    assert_eq!(
        lease_after, lease,
        "proclaiming keeps the key under its lease"
    );
    assert!(leading.is_leading());

    leading.resign().await.unwrap();
    assert_eq!(locks.holder("scheduler").await.unwrap(), None);
}

/// A leader whose key is gone proclaims nothing: the put is fenced by the key's create
/// revision, so it neither changes nor makes a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_key_is_gone_cannot_proclaim() {
    let cluster = shared();
    let locks = locks(cluster, "election-gone").await;
    let prefix = locks.lock_prefix("scheduler").unwrap();
    let admin = raw(cluster).await;
    let election = Election::new(locks.clone(), "scheduler").value("a");
    let leading = election.campaign(Duration::ZERO).await.unwrap();
    let (key, _, _) = go_leader(&admin, &prefix).await.expect("a leader");
    admin.kv_client().delete(key, None).await.unwrap();

    let err = locks.proclaim(leading.guard(), "b").await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    assert!(
        go_leader(&admin, &prefix).await.is_none(),
        "the proclamation wrote"
    );
    tokio::time::timeout(Duration::from_secs(5), leading.lost())
        .await
        .expect("the leader learns of its deleted key");
}

/// A Go candidate that campaigned first leads: we read its value, our candidate waits
/// behind it and leads once it resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_leaders_value_is_read_and_our_candidate_follows_it() {
    let cluster = shared();
    let locks = locks(cluster, "election-go").await;
    let prefix = locks.lock_prefix("scheduler").unwrap();
    let go = raw(cluster).await;
    let (go_key, _, go_rev) = go_put(&go, |lease| format!("{prefix}/{lease:x}"), "go:9000").await;

    let holder = locks
        .holder("scheduler")
        .await
        .unwrap()
        .expect("the Go leader");
    assert_eq!(
        (holder.key.as_str(), holder.value.as_slice()),
        (go_key.as_str(), &b"go:9000"[..])
    );
    assert_eq!(holder.token.get(), u64::try_from(go_rev).unwrap());
    let election = Election::new(locks.clone(), "scheduler").value("rust:8080");
    let err = election.campaign(Duration::ZERO).await.unwrap_err();
    assert!(err.is_busy(), "{err}");

    let campaign = tokio::spawn(async move {
        let leading = election.campaign(Duration::from_secs(10)).await.unwrap();
        let term = leading.term();
        leading.resign().await.unwrap();
        term
    });
    // Go's `Resign`: the leader deletes its key.
    go.kv_client().delete(go_key, None).await.unwrap();
    let term = campaign.await.unwrap();
    assert!(term.get() > u64::try_from(go_rev).unwrap());
}
