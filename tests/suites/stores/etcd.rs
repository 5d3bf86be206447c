//! The etcd store on a real 3-member etcd cluster the harness starts: exclusion across
//! clients and across scopes of one client, the Go `concurrency.Mutex` layout (a
//! contender made as the Go package makes one excludes us and is waited for, and ours
//! excludes it), a deleted key firing `lost()`, fenced writes, cancellation; and the
//! cluster's faults: quorum loss, and a leader paused mid-hold.

use crate::checks;
// Election values in the Go `Election` layout.
mod election;
// Read-write locks in the Go recipe's layout.
mod read_write;

use std::ops::ControlFlow;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use lock_core::etcd_client::{
    self as etcd, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use lock_core::{
    AnyLocks, DistributedLock, Election, EtcdLocks, HeldLock, LockConfig, LockOptions, LockScope,
    Released,
};
use lock_tests::EtcdCluster;

fn config() -> LockConfig {
    // A 2 s session lease (etcd's TTLs are whole seconds), renewed every 500 ms.
    LockConfig::new()
        .with_watchdog_lease(Duration::from_millis(1_500))
        .with_wait(Duration::from_secs(10))
        .with_command_timeout(Duration::from_secs(2))
}

/// One cluster for the tests that do not hurt it, each under a root of its own.
fn shared() -> &'static EtcdCluster {
    static CLUSTER: OnceLock<EtcdCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| EtcdCluster::start(3))
}

async fn locks(cluster: &EtcdCluster, root: &str) -> EtcdLocks {
    EtcdLocks::connect(&cluster.url(root), config())
        .await
        .expect("connect to the test etcd cluster")
}

/// Two clients (two sessions) of `cluster` under `root`.
async fn two(cluster: &EtcdCluster, root: &str) -> (EtcdLocks, EtcdLocks) {
    (locks(cluster, root).await, locks(cluster, root).await)
}

async fn raw(cluster: &EtcdCluster) -> etcd::Client {
    etcd::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a raw etcd client")
}

/// The keys under `prefix/`, oldest first.
async fn queue(client: &etcd::Client, prefix: &str) -> Vec<(String, i64)> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    client
        .kv_client()
        .get(format!("{prefix}/"), Some(options))
        .await
        .unwrap()
        .kvs()
        .iter()
        .map(|kv| (kv.key_str().unwrap().to_owned(), kv.create_revision()))
        .collect()
}

/// Deletes the holder's key under `prefix/` by hand (the oldest), as an operator
/// could.
async fn delete_holders_key(admin: &etcd::Client, prefix: &str) {
    let (key, _) = queue(admin, prefix).await.remove(0);
    admin.kv_client().delete(key, None).await.unwrap();
}

async fn await_queue_len(client: &etcd::Client, prefix: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let q = queue(client, prefix).await;
        if q.len() == len {
            return;
        }
        assert!(Instant::now() < deadline, "queue of {prefix} stayed {q:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_never_hold_one_name_at_once_and_tokens_grow() {
    let cluster = shared();
    let (a, b) = two(cluster, "exclusion").await;
    let stores = [a, b];
    checks::never_two_holders_and_tokens_grow(&stores, 8).await;
    let prefix = stores[0].lock_prefix("counter").unwrap();
    assert_eq!(prefix, "/exclusion/lock/counter");
    await_queue_len(&raw(cluster).await, &prefix, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scopes_of_one_client_take_turns() {
    let cluster = shared();
    let one = locks(cluster, "scopes").await;
    let stores = [one.clone(), one];
    // Tasks are scopes of their own: the two "clients" are one, sharing its key.
    checks::never_two_holders_and_tokens_grow(&stores, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_then_timeout_then_woken() {
    let cluster = shared();
    let (a, b) = two(cluster, "busy").await;
    checks::busy_then_timeout_then_woken(&a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_timed_out_waits_leave_no_key() {
    let cluster = shared();
    let (a, b) = two(cluster, "cancel").await;
    checks::cancelled_waits_leave_no_lock(&a, &b).await;
    let held = a.lock("y").await.unwrap();
    let err = b
        .acquire("y", LockOptions::new().wait(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    let prefix = a.lock_prefix("y").unwrap();
    let client = raw(cluster).await;
    await_queue_len(&client, &prefix, 1).await;
    held.release().await.unwrap();
    await_queue_len(&client, &prefix, 0).await;
    await_queue_len(&client, &a.lock_prefix("x").unwrap(), 0).await;
}

/// What the Go package's `Mutex.Lock` writes for a holder: the key `<prefix>/<lease
/// id in hex>` under the session's lease, created only if absent.
async fn go_contender(client: &etcd::Client, prefix: &str) -> (String, i64) {
    let (key, lease, _) = go_put(client, |lease| format!("{prefix}/{lease:x}"), "").await;
    (key, lease)
}

/// A key made as the Go packages make one: under a fresh lease, with `value`, in a
/// transaction guarded by `CreateRevision == 0`; its key, lease and create revision.
async fn go_put(
    client: &etcd::Client,
    key: impl FnOnce(i64) -> String,
    value: &str,
) -> (String, i64, i64) {
    let lease = client.lease_client().grant(10, None).await.unwrap().id();
    let key = key(lease);
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.as_str(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let answer = client.kv_client().txn(txn).await.unwrap();
    assert!(answer.succeeded());
    let created = answer.header().unwrap().revision();
    (key, lease, created)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_style_contender_excludes_us_and_is_waited_for() {
    let cluster = shared();
    let locks = locks(cluster, "go").await;
    let prefix = locks.lock_prefix(("order", 7_u64)).unwrap();
    let go = raw(cluster).await;
    let (go_key, go_lease) = go_contender(&go, &prefix).await;

    let err = locks.try_lock(("order", 7_u64)).await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    let waiter = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock(("order", 7_u64)).await })
    };
    // The waiter queued its own key behind the Go one, in the Go naming.
    await_queue_len(&go, &prefix, 2).await;
    let q = queue(&go, &prefix).await;
    assert_eq!(q[0].0, go_key);
    let ours = q[1].0.rsplit('/').next().unwrap();
    assert!(
        i64::from_str_radix(ours, 16).is_ok_and(|id| id != go_lease),
        "{ours}"
    );
    assert!(
        !waiter.is_finished(),
        "granted while the Go holder holds it"
    );
    go.kv_client().delete(go_key.as_str(), None).await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the predecessor's deletion")
        .unwrap()
        .unwrap();
    assert!(g.is_held());
    assert_eq!(g.fencing_token().unwrap().get(), q[1].1 as u64);
    g.release().await.unwrap();
    await_queue_len(&go, &prefix, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_holder_excludes_a_go_style_contender() {
    let cluster = shared();
    let locks = locks(cluster, "go-owner").await;
    let held = locks.lock("report").await.unwrap();
    let prefix = locks.lock_prefix("report").unwrap();
    let go = raw(cluster).await;
    let (go_key, _) = go_contender(&go, &prefix).await;
    // The Go package's owner: the key of lowest create revision under the prefix.
    let q = queue(&go, &prefix).await;
    assert_eq!(q.len(), 2);
    assert_ne!(
        q[0].0, go_key,
        "the Go contender would think it holds the lock"
    );
    assert_eq!(held.fencing_token().unwrap().get(), q[0].1 as u64);
    held.release().await.unwrap();
    let q = queue(&go, &prefix).await;
    assert_eq!(
        q,
        [(go_key, q[0].1)],
        "our release left the Go contender the owner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_fires_lost_and_lets_another_owner_in() {
    let cluster = shared();
    let (a, b) = two(cluster, "deleted").await;
    let g = a.lock("job").await.unwrap();
    let prefix = a.lock_prefix("job").unwrap();
    let admin = raw(cluster).await;
    delete_holders_key(&admin, &prefix).await;
    let deleted_at = Instant::now();
    checks::loss_lets_another_owner_in(g, &b, "job", deleted_at, "lost() fired on the deletion")
        .await;
}

/// The holder watches its key: a deletion fires `lost()` long before the renewal that
/// would find it (every 10 s with a 30 s session lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_key_fires_lost_before_the_next_renewal() {
    let cluster = shared();
    let slow = config().with_watchdog_lease(Duration::from_secs(30));
    let url = cluster.url("deleted-watched");
    let a = EtcdLocks::connect(&url, slow.clone()).await.unwrap();
    let b = EtcdLocks::connect(&url, slow).await.unwrap();
    let admin = raw(cluster).await;
    let prefix = a.lock_prefix("job").unwrap();
    for hold_first in [Duration::ZERO, Duration::from_secs(1)] {
        let g = a.lock("job").await.unwrap();
        // Deleted before and after the watch starts.
        tokio::time::sleep(hold_first).await;
        delete_holders_key(&admin, &prefix).await;
        let deleted_at = Instant::now();
        checks::loss_lets_another_owner_in(
            g,
            &b,
            "job",
            deleted_at,
            "lost() fired on the deletion",
        )
        .await;
        await_queue_len(&admin, &prefix, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_apply_only_while_held() {
    let cluster = shared();
    let locks = locks(cluster, "fenced").await;
    let g = locks.lock("stock").await.unwrap();
    let admin = raw(cluster).await;
    locks
        .write_fenced(&g, [TxnOp::put("/fenced/data/stock", "99", None)])
        .await
        .expect("a fenced write while held");
    delete_holders_key(&admin, &locks.lock_prefix("stock").unwrap()).await;
    let err = locks
        .write_fenced(&g, [TxnOp::put("/fenced/data/stock", "98", None)])
        .await
        .unwrap_err();
    assert!(err.is_lost(), "{err}");
    let value = admin
        .kv_client()
        .get("/fenced/data/stock", None)
        .await
        .unwrap();
    assert_eq!(
        value.kvs()[0].value(),
        b"99",
        "a refused write went through"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_leases_do_not_apply_and_hold_until_expiry_gives_back() {
    let cluster = shared();
    let (a, b) = two(cluster, "leases").await;
    // Past the 2 s session lease: only renewals kept it.
    checks::session_locks_ignore_leases_and_give_back_on_expiry(&a, &b, Duration::from_secs(3))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_keeps_its_place_past_the_session_lease() {
    let cluster = shared();
    let (a, b) = two(cluster, "long-wait").await;
    let held = a.lock("slow").await.unwrap();
    let waiter = tokio::spawn(async move { b.lock("slow").await });
    // Longer than the waiter's 2 s lease: nothing but its own keep-alives kept it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(!waiter.is_finished());
    let prefix = a.lock_prefix("slow").unwrap();
    assert_eq!(queue(&raw(cluster).await, &prefix).await.len(), 2);
    held.release().await.unwrap();
    let g = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter got the lock")
        .unwrap()
        .unwrap();
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_locks_opens_etcd_urls() {
    let cluster = shared();
    let any = AnyLocks::open(&cluster.url("any"), config()).await.unwrap();
    assert!(matches!(any, AnyLocks::Etcd(_)));
    let g = any.try_lock_named("x").await.unwrap();
    g.release().await.unwrap();
    let scope = LockScope::new();
    let one = any
        .acquire("y", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    let two = any
        .acquire("y", LockOptions::new().scope(&scope))
        .await
        .unwrap();
    assert_eq!(one.token(), two.token(), "reentered, not taken twice");
    drop(two);
    drop(one);
}
/// Two of three members down: the quorum is gone. A holder's `lost()` fires by the
/// end of its lease (no keep-alive can be confirmed), acquisitions fail with a clear
/// error, and once the members are back another client gets the lock with a larger
/// token, never while the first guard still claimed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_quorum_loses_the_lock_by_its_lease_end() {
    let mut cluster = EtcdCluster::start(3);
    let (a, b) = two(&cluster, "quorum").await;
    let g = a.lock("job").await.unwrap();
    let token = g.fencing_token().unwrap().get();
    cluster.kill(1);
    cluster.kill(2);
    let down = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fired without a quorum");
    // The 2 s lease, counted from the last keep-alive sent before the members died.
    assert!(
        down.elapsed() <= Duration::from_millis(2_100),
        "{:?}",
        down.elapsed()
    );
    assert!(!g.is_held());
    let err = b.try_lock("job").await.map(drop).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    cluster.restart(1);
    cluster.restart(2);
    cluster.await_healthy(&[0, 1, 2], Duration::from_secs(30));
    let next = b
        .acquire("job", LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(next.fencing_token().unwrap().get() > token);
    let err = g.release().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    next.release().await.unwrap();
}

/// The member that leads, and that the clients call first, is frozen while a lock is
/// held: the others elect a new leader, calls move on to them, and the lock is never
/// lost nor taken by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_mid_hold_keeps_the_lock() {
    let cluster = EtcdCluster::start(3);
    let leader = leader(&cluster).await;
    // The leader first in the connect string: the member the clients call first.
    let url = cluster.url_from(leader, "leader");
    let a = EtcdLocks::connect(&url, config()).await.unwrap();
    let b = EtcdLocks::connect(&url, config()).await.unwrap();
    let g = a.lock("job").await.unwrap();
    cluster.pause(leader);
    // Several lease lengths: renewals must reach the new leader.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert!(g.is_held(), "lost with a quorum still up");
        if let Ok(other) = b.try_lock("job").await {
            panic!(
                "another client took a held lock: {:?}",
                other.fencing_token()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.resume(leader);
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
}

/// The member that leads the cluster now.
async fn leader(cluster: &EtcdCluster) -> usize {
    for i in 0..cluster.len() {
        let endpoint = format!("http://127.0.0.1:{}", cluster.client_port(i));
        let mut member = etcd::Client::connect([endpoint], None).await.unwrap();
        let status = member.status().await.unwrap();
        let me = status.header().map(|h| h.member_id());
        if me == Some(status.leader()) {
            return i;
        }
    }
    panic!("no member leads");
}

/// A holder cut off from every member (TCP proxies that stop forwarding, no socket
/// closed) while another client waits: the holder's `lost()` fires by its lease's end,
/// before the waiter is granted (the server frees the key only when the lease, kept
/// alive no later than the holder last confirmed it, runs out), the cut client's
/// calls fail with a clear error, and once healed its release says the lock was
/// lost and it can lock again with a new session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_loses_the_lock_before_a_waiter_gets_it() {
    let cluster = shared();
    let (proxies, url) = cluster.proxied("partition");
    let a = EtcdLocks::connect(&url, config()).await.unwrap();
    let b = locks(cluster, "partition").await;
    let g = a.lock("job").await.unwrap();
    let token = g.fencing_token().unwrap().get();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let next = b
                .acquire("job", LockOptions::new().wait(Duration::from_secs(20)))
                .await;
            (Instant::now(), next)
        })
    };
    await_queue_len(&raw(cluster).await, &a.lock_prefix("job").unwrap(), 2).await;
    for p in &proxies {
        p.cut();
    }
    let cut = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fired while cut off");
    let lost = Instant::now();
    // The 2 s lease, from the last keep-alive sent before the cut.
    assert!(
        lost - cut <= Duration::from_millis(2_100),
        "{:?}",
        lost - cut
    );
    assert!(!g.is_held());
    let err = a.try_lock("other").await.map(drop).unwrap_err();
    assert!(err.is_unavailable(), "{err}");

    let (granted, next) = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter was granted once the lease ran out")
        .unwrap();
    let next = next.unwrap();
    assert!(
        lost <= granted,
        "granted {:?} before the loss",
        lost - granted
    );
    assert!(next.fencing_token().unwrap().get() > token);

    for p in &proxies {
        p.heal();
    }
    let err = g.release().await.unwrap_err();
    assert!(err.is_lost(), "{err}");
    next.release().await.unwrap();
    let again = a.lock("job").await.unwrap();
    assert!(again.is_held());
    again.release().await.unwrap();
}

/// A client whose connecting runtime ended goes on: the lock it took there is still
/// renewed (kept past its lease) and excluded from others, and the client serves calls
/// on the next runtime, its release included.
#[test]
fn a_client_outlives_the_runtime_that_connected_it() {
    let cluster = shared();
    let rt1 = crate::common::runtime();
    let a = rt1.block_on(locks(cluster, "runtimes"));
    let g = rt1.block_on(a.lock("job")).unwrap();
    drop(rt1);
    let rt2 = crate::common::runtime();
    rt2.block_on(async {
        let b = locks(cluster, "runtimes").await;
        // One and a half session leases: a lease nobody kept alive would be gone.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            g.is_held(),
            "the guard gave up a lock its lease still holds"
        );
        let err = b.try_lock("job").await.map(drop).unwrap_err();
        assert!(err.is_busy(), "{err}");
        let other = a.try_lock("other").await.unwrap();
        other.release().await.unwrap();
        assert_eq!(g.release().await.unwrap(), Released::Unlocked);
        b.try_lock("job").await.unwrap().release().await.unwrap();
    });
}

/// A leader whose key is deleted: its work is dropped once the loss is seen, and
/// `run` campaigns again and leads a new, larger term; told not to rejoin, it returns
/// the loss instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_leader_that_loses_its_key_campaigns_again() {
    let cluster = shared();
    let a = locks(cluster, "election").await;
    let prefix = a.lock_prefix("leader").unwrap();
    let admin = raw(cluster).await;
    for rejoin in [true, false] {
        let (terms, mut led) = tokio::sync::mpsc::unbounded_channel();
        let election = Election::new(a.clone(), "leader").rejoin_after_loss(rejoin);
        let run = tokio::spawn(async move {
            election
                .run(|term| {
                    let terms = terms.clone();
                    async move {
                        terms.send(term.get()).unwrap();
                        // Leads until the leadership is lost.
                        std::future::pending::<ControlFlow<()>>().await
                    }
                })
                .await
        });
        let first = led.recv().await.unwrap();
        delete_holders_key(&admin, &prefix).await;
        if rejoin {
            let second = tokio::time::timeout(Duration::from_secs(5), led.recv())
                .await
                .expect("led again after the loss")
                .unwrap();
            assert!(second > first, "{second} after {first}");
            run.abort();
            let _ = run.await;
        } else {
            let err = tokio::time::timeout(Duration::from_secs(5), run)
                .await
                .expect("run returned on the loss")
                .unwrap()
                .unwrap_err();
            assert!(err.is_lost(), "{err}");
            assert!(led.try_recv().is_err(), "led again though told not to");
        }
        await_queue_len(&admin, &prefix, 0).await;
    }
}

/// A release whose delete never reached a member (each connection broke with it on the
/// wire) answers the error, and the key is deleted once a member answers: the session's
/// lease, kept alive for the client's other lock, would never free it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_failed_deletes_the_key_once_the_store_is_back() {
    let cluster = shared();
    let (proxies, url) = cluster.proxied("blip");
    // A 6 s session lease, renewed every 2 s: the broken calls do not lose it.
    let patient = LockConfig::new()
        .with_watchdog_lease(Duration::from_secs(6))
        .with_wait(Duration::from_secs(10))
        .with_command_timeout(Duration::from_millis(400));
    let a = EtcdLocks::connect(&url, patient).await.unwrap();
    let b = locks(cluster, "blip").await;
    let admin = raw(cluster).await;
    let keep = a.lock("keep").await.unwrap();
    let job = a.lock("job").await.unwrap();
    let prefix = a.lock_prefix("job").unwrap();
    let (key, _) = queue(&admin, &prefix).await.remove(0);
    // The first request naming the key on each member's connection breaks it with the
    // request on the wire: the member never sees that delete.
    for p in &proxies {
        let key = key.clone().into_bytes();
        p.reset_request(move |chunk| chunk.windows(key.len()).any(|w| w == key));
    }
    let err = job.release().await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    // The release's delete broke on the wire, so no member saw it (the key itself may
    // be gone already: the background retry can be that quick).
    assert!(
        proxies.iter().any(|p| !p.is_request_armed()),
        "no member's connection broke with the delete"
    );
    await_queue_len(&admin, &prefix, 0).await;
    assert!(keep.is_held(), "the other lock was lost in the cut");
    let next = b
        .acquire("job", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    next.release().await.unwrap();
    // The client's own next grant of the name is a new key, with a larger token.
    let again = a.lock("job").await.unwrap();
    again.release().await.unwrap();
    keep.release().await.unwrap();
}

/// One client holding many locks at once: its renewal reads all their keys, more than
/// the 128 operations etcd takes in one transaction, and every lock stays held past
/// its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_locks_of_one_client_stay_held_past_their_lease() {
    let lease = Duration::from_secs(6);
    let many = EtcdLocks::connect(&shared().url("many"), config().with_watchdog_lease(lease))
        .await
        .unwrap();
    let guards = futures_util::future::join_all((0..300).map(|i| many.lock(format!("n{i}"))))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    // The scenario is time: renewals every third of the lease, past its end.
    tokio::time::sleep(lease + Duration::from_secs(2)).await;
    let lost = guards.iter().filter(|g| !g.is_held()).count();
    assert_eq!(lost, 0, "{lost} of 300 locks lost");
    for g in guards {
        g.release().await.unwrap();
    }
}

/// Readers write nothing: a read hold, which others share, is no fence for a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_hold_makes_no_fenced_write() {
    let (a, b) = two(shared(), "read-fence").await;
    let r1 = a.acquire("stock", LockOptions::new().read()).await.unwrap();
    let r2 = b.acquire("stock", LockOptions::new().read()).await.unwrap();
    for (who, locks, r) in [("a", &a, &r1), ("b", &b, &r2)] {
        let err = locks
            .write_fenced(r, [TxnOp::put("/read-fence/data/stock", who, None)])
            .await
            .unwrap_err();
        assert!(
            matches!(err, lock_core::LockError::NoFencingToken { .. }),
            "{who}: {err}"
        );
    }
    let value = raw(shared())
        .await
        .kv_client()
        .get("/read-fence/data/stock", None)
        .await
        .unwrap();
    assert!(value.kvs().is_empty(), "a reader wrote");
}

/// A lock lost to its key's deletion gives its client's turn on the name back at once:
/// the same client takes the name again while the lost guard is still alive, and the
/// lost guard's release then deletes nothing of the new holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lock_passes_its_clients_turn_on() {
    let cluster = shared();
    let a = locks(cluster, "lost-turn").await;
    let g = a.lock("job").await.unwrap();
    let prefix = a.lock_prefix("job").unwrap();
    let admin = raw(cluster).await;
    delete_holders_key(&admin, &prefix).await;
    tokio::time::timeout(Duration::from_secs(5), g.lost())
        .await
        .expect("lost() fired on the deletion");
    let again = a
        .acquire("job", LockOptions::new().wait(Duration::from_secs(3)))
        .await
        .expect("the same client takes the name again beside its lost guard");
    assert!(
        g.release().await.is_err(),
        "the lost guard releases nothing"
    );
    assert!(again.is_held());
    assert_eq!(queue(&admin, &prefix).await.len(), 1, "the new key stays");
    again.release().await.unwrap();
}
