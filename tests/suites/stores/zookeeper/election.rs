//! Leader election on ZooKeeper through the faults that gave Curator's LeaderLatch two
//! leaders: a leader's connection lost and found again within its session
//! (CURATOR-620, CURATOR-653: the latch reset and queued a second node while its first
//! still led), and a leader's session expiring while it is cut off (CURATOR-696: the
//! old leader went on believing while the new one led). Two candidates campaign again
//! after every loss, as a latch does; a checker fails on any instant where both lead
//! with validity left, and each case ends with one leader and no node left behind.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{Election, Leadership, LockConfig, ZkGuard, ZkLocks};
use lock_tests::{TcpProxy, ZooKeeperServer};

use super::raw;

/// The session timeout: a silent connection is given up on after 2/5 of it (1.6 s),
/// and a leader stays leading a third of it (1.33 s) after that.
const SESSION: Duration = Duration::from_millis(4_000);
/// A leader's validity may exceed the checker's delay by this much and still count.
const MARGIN: Duration = Duration::from_millis(3);

type Slot = Arc<Mutex<Option<Leadership<ZkGuard>>>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Campaigns, leads until the leadership is lost, and campaigns again, until `until`;
/// then resigns. Answers the terms it led.
async fn latch(election: Election<ZkLocks, &'static str>, slot: Slot, until: Instant) -> Vec<u64> {
    let mut terms = Vec::new();
    while Instant::now() < until {
        let leadership = match election.campaign(Duration::from_millis(500)).await {
            Ok(l) => l,
            // Not leading yet, or cut off: campaign again.
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        terms.push(leadership.term().get());
        let lost = leadership.lost();
        *lock(&slot) = Some(leadership);
        let _ = tokio::time::timeout_at(until.into(), lost).await;
        // Lost: dropped, its node deleted in the background. Past `until`: resigned.
        let taken = lock(&slot).take();
        if let Some(l) = taken.filter(|l| l.is_leading()) {
            let _ = l.resign().await;
        }
    }
    terms
}

/// Runs leader `a` (its connection through `proxy`) and candidate `b` for `run_for`,
/// calling `fault(proxy)` once `a` leads, with the checker on; answers each one's terms.
async fn two_candidates<F, Fut>(
    server: &ZooKeeperServer,
    run_for: Duration,
    fault: F,
) -> (Vec<u64>, Vec<u64>)
where
    F: FnOnce(Arc<TcpProxy>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let proxy = Arc::new(TcpProxy::start(server.port()));
    let config = LockConfig::new().with_watchdog_lease(SESSION);
    let a = ZkLocks::connect(&format!("127.0.0.1:{}", proxy.port()), config.clone())
        .await
        .unwrap();
    let b = ZkLocks::connect(&server.connect_string(), config)
        .await
        .unwrap();
    let dir = a.lock_path("leader").unwrap();
    let until = Instant::now() + run_for;
    let slots = [Slot::default(), Slot::default()];
    let first = tokio::spawn(latch(Election::new(a, "leader"), slots[0].clone(), until));
    while lock(&slots[0]).is_none() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = tokio::spawn(latch(Election::new(b, "leader"), slots[1].clone(), until));
    let faulting = tokio::spawn(fault(proxy.clone()));
    while !first.is_finished() || !second.is_finished() {
        let leading: Vec<(usize, u64)> = slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let s = lock(s);
                let l = s.as_ref()?;
                (l.is_leading() && l.valid_for() > MARGIN).then(|| (i, l.term().get()))
            })
            .collect();
        assert!(leading.len() < 2, "two leaders at once: {leading:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    faulting.await.unwrap();
    proxy.heal();
    let terms = (first.await.unwrap(), second.await.unwrap());
    // Every node goes: none left behind by a reset or an expired session.
    let admin = raw(server).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = admin.list_children(&dir).await.unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "nodes left behind: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    terms
}

/// Every term of both candidates, in the order they were granted, is unique and grows
/// with each new leader.
fn assert_terms(a: &[u64], b: &[u64]) {
    let mut all: Vec<u64> = a.iter().chain(b).copied().collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a term granted twice: {a:?} {b:?}");
    assert!(a.windows(2).all(|w| w[0] < w[1]), "{a:?}");
    assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
}

/// CURATOR-620 and CURATOR-653: the leader's connection drops and comes back within
/// its session. It leads on or loses and campaigns again, but never beside the other
/// candidate, and its first node does not linger to block everyone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_reconnects_within_its_session_never_leads_beside_another() {
    let server = ZooKeeperServer::start();
    let (a, b) = two_candidates(&server, Duration::from_secs(8), |proxy| async move {
        // Longer than the 1.6 s after which the client gives the connection up,
        // shorter than the session.
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        proxy.heal();
    })
    .await;
    assert!(!a.is_empty(), "the first candidate never led");
    assert_terms(&a, &b);
}

/// CURATOR-696: the leader is cut off past its session's expiry. It stops leading
/// before the other candidate leads, and once back (a new session) it campaigns again
/// behind the new leader, never beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_session_expires_stops_before_another_leads() {
    let server = ZooKeeperServer::start();
    let (a, b) = two_candidates(&server, Duration::from_secs(14), |proxy| async move {
        proxy.cut();
        tokio::time::sleep(SESSION * 2).await;
        proxy.heal();
    })
    .await;
    assert!(!a.is_empty(), "the first candidate never led");
    assert!(
        !b.is_empty(),
        "the second candidate never led after the expiry"
    );
    assert_terms(&a, &b);
}
