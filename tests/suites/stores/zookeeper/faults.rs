//! Contender nodes are removed on every path: a release or an acquisition across a
//! server pause the connection does not survive, an acquisition cancelled with its
//! create in flight, a create's or a delete's reply lost (the request executed), a
//! delete lost (never executed); and a grant made as the connection drops is suspended
//! at once. Each fault keeps the session alive, so a node left behind would block the
//! lock for as long as the session lives.

use std::time::{Duration, Instant};

use lock_core::zookeeper_client as zk;
use lock_core::{LockConfig, Released, ZkLocks};
use lock_tests::{TcpProxy, ZooKeeperServer};

use super::{config, raw};

/// A long session (the server's longest with its 200 ms tick): the client gives up on
/// a silent connection after 2/5 of it (1.6 s), pings every 600 ms when idle, and a
/// lock stays held a third of it (1.33 s) after the disconnection is noticed.
const SESSION: Duration = Duration::from_millis(4_000);
/// A server pause the connection does not survive and the session does: longer than
/// the 1.6 s the client waits for a reply, shorter than the session left after the last
/// ping (4 s - 0.6 s), and ended before a holder's suspension (1 s + 1.33 s at the least).
const PAUSE: Duration = Duration::from_millis(1_900);
/// Upper bound for a reconnection and the deletes it lets through.
const PROMPTLY: Duration = Duration::from_secs(10);

/// ZooKeeper request types (`ZooDefs.OpCode`).
const CREATE2: i32 = 15;
const DELETE: i32 = 2;
const GET_CHILDREN: i32 = 8;

async fn long_session(connect: &str) -> ZkLocks {
    ZkLocks::connect(connect, LockConfig::new().with_watchdog_lease(SESSION))
        .await
        .expect("connect to the test zookeeper")
}

/// Tells a chunk holding a client request of type `op`. Frames are a length, then the
/// xid (positive for requests, not for pings or the connect) and the type.
fn zk_request(op: i32) -> impl Fn(&[u8]) -> bool + Send + 'static {
    move |mut chunk: &[u8]| {
        while chunk.len() >= 12 {
            let int = |at: usize| {
                i32::from_be_bytes([chunk[at], chunk[at + 1], chunk[at + 2], chunk[at + 3]])
            };
            if int(4) > 0 && int(8) == op {
                return true;
            }
            match usize::try_from(int(0)) {
                Ok(len) if len + 4 <= chunk.len() => chunk = &chunk[len + 4..],
                _ => return false,
            }
        }
        false
    }
}

/// Polls until `dir` has no contender node; fails with `why` and the nodes left.
async fn await_no_contenders(admin: &zk::Client, dir: &str, why: &str) {
    let deadline = Instant::now() + PROMPTLY;
    loop {
        let left = admin.list_children(dir).await.unwrap();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "{why}: {left:?} stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `count` sessions watch `node`.
async fn await_watchers(server: &ZooKeeperServer, node: &str, count: usize) {
    let deadline = Instant::now() + PROMPTLY;
    while server.watchers_of(node) != count {
        assert!(
            Instant::now() < deadline,
            "{node} never had {count} watchers"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The only contender node under `dir`, as a full path.
/// `job` is free: taken at once, and given back.
async fn assert_free(locks: &ZkLocks) {
    let g = locks.try_lock("job").await.expect("the lock is free");
    g.release().await.unwrap();
}

async fn only_node(admin: &zk::Client, dir: &str) -> String {
    let nodes = admin.list_children(dir).await.unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    format!("{dir}/{}", nodes[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_server_pause_deletes_the_node_once_reconnected() {
    let server = ZooKeeperServer::start();
    let (a, b) = (
        long_session(&server.connect_string()).await,
        long_session(&server.connect_string()).await,
    );
    let dir = a.lock_path("job").unwrap();
    let g = a.lock("job").await.unwrap();
    server.pause();
    // The delete goes out to the frozen server, and the connection is given up on.
    let release = tokio::spawn(g.release());
    tokio::time::sleep(PAUSE).await;
    server.resume();
    let admin = raw(&server).await;
    await_no_contenders(&admin, &dir, "the released node").await;
    let released = tokio::time::timeout(PROMPTLY, release)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(released.unwrap(), Released::Unlocked);
    assert_free(&b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_across_a_server_pause_finds_the_node_it_created() {
    let server = ZooKeeperServer::start();
    let a = long_session(&server.connect_string()).await;
    let dir = a.lock_path("job").unwrap();
    a.lock("job").await.unwrap().release().await.unwrap();
    server.pause();
    // The create goes out to the frozen server, and the connection is given up on;
    // the server executes it when it resumes.
    let acquiring = tokio::spawn({
        let a = a.clone();
        async move { a.lock("job").await }
    });
    tokio::time::sleep(PAUSE).await;
    server.resume();
    let acquired = tokio::time::timeout(PROMPTLY, acquiring)
        .await
        .unwrap()
        .unwrap();
    let g = acquired.expect("granted on the node it created");
    let admin = raw(&server).await;
    only_node(&admin, &dir).await;
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    await_no_contenders(&admin, &dir, "the recovered node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_cancelled_with_its_create_in_flight_leaves_no_node() {
    let server = ZooKeeperServer::start();
    let a = long_session(&server.connect_string()).await;
    let dir = a.lock_path("job").unwrap();
    // The lock's own node exists: the create below is the contender's.
    a.lock("job").await.unwrap().release().await.unwrap();
    server.pause();
    let cut = tokio::time::timeout(Duration::from_millis(200), a.lock("job")).await;
    assert!(cut.is_err(), "granted by a frozen server");
    // Resumed before the client gives up on the connection: the create is executed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.resume();
    let admin = raw(&server).await;
    await_no_contenders(&admin, &dir, "the cancelled acquisition's node").await;
    assert_free(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_is_recovered_by_the_node_uuid() {
    let server = ZooKeeperServer::start();
    let proxy = TcpProxy::start(server.port());
    let b = long_session(&format!("127.0.0.1:{}", proxy.port())).await;
    let dir = b.lock_path("job").unwrap();
    b.lock("job").await.unwrap().release().await.unwrap();
    proxy.reset_reply_to(zk_request(CREATE2));
    let g = b
        .lock("job")
        .await
        .expect("the acquisition finds the node it created");
    let admin = raw(&server).await;
    assert!(g.is_held());
    let ours = only_node(&admin, &dir).await;
    let (_, stat) = admin.get_data(&ours).await.unwrap();
    assert_eq!(
        g.fencing_token().unwrap().get(),
        u64::try_from(stat.czxid).unwrap()
    );
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    await_no_contenders(&admin, &dir, "the recovered node").await;
}

/// Releases a lock through a proxy armed with `fault` for the release's delete: the
/// release still answers `Unlocked` and the node goes.
async fn release_through(fault: impl FnOnce(&TcpProxy)) {
    let server = ZooKeeperServer::start();
    let proxy = TcpProxy::start(server.port());
    let b = long_session(&format!("127.0.0.1:{}", proxy.port())).await;
    let dir = b.lock_path("job").unwrap();
    let g = b.lock("job").await.unwrap();
    fault(&proxy);
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    let admin = raw(&server).await;
    await_no_contenders(&admin, &dir, "the released node").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_delete_reply_still_releases() {
    release_through(|proxy| proxy.reset_reply_to(zk_request(DELETE))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_delete_is_lost_deletes_it_again() {
    release_through(|proxy| proxy.reset_request(zk_request(DELETE))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_try_lock_whose_delete_is_lost_leaves_no_node() {
    let server = ZooKeeperServer::start();
    let proxy = TcpProxy::start(server.port());
    let a = long_session(&server.connect_string()).await;
    let b = long_session(&format!("127.0.0.1:{}", proxy.port())).await;
    let dir = a.lock_path("job").unwrap();
    let g = a.lock("job").await.unwrap();
    proxy.reset_request(zk_request(DELETE));
    let err = b.try_lock("job").await.unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert_eq!(g.release().await.unwrap(), Released::Unlocked);
    let admin = raw(&server).await;
    await_no_contenders(&admin, &dir, "the busy contender's node").await;
    assert_free(&a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_made_as_the_connection_drops_is_suspended_at_once() {
    let server = ZooKeeperServer::start();
    let proxy = TcpProxy::start(server.port());
    let a = ZkLocks::connect(&server.connect_string(), config())
        .await
        .unwrap();
    let b = ZkLocks::connect(&format!("127.0.0.1:{}", proxy.port()), config())
        .await
        .unwrap();
    let dir = a.lock_path("job").unwrap();
    let admin = raw(&server).await;
    let g = a.lock("job").await.unwrap();
    let held = only_node(&admin, &dir).await;
    let waiter = tokio::spawn(async move { b.lock("job").await });
    await_watchers(&server, &held, 2).await;
    // The waiter's look at the queue after the holder leaves is answered, then its
    // connection drops, and it cannot reconnect.
    proxy.close_after_reply_to(zk_request(GET_CHILDREN));
    g.release().await.unwrap();
    let granted = tokio::time::timeout(PROMPTLY, waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let at = Instant::now();
    // Suspended from the grant: lost a third of the 1.5 s session later, not when the
    // client gives the session up (7/5 of it).
    tokio::time::timeout(Duration::from_millis(1_200), granted.lost())
        .await
        .expect("lost() fired a third of the session after the drop");
    assert!(
        at.elapsed() >= Duration::from_millis(300),
        "{:?}",
        at.elapsed()
    );
    proxy.heal();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_nodes_deletion_after_a_reconnection_fires_lost() {
    let server = ZooKeeperServer::start();
    let proxy = TcpProxy::start(server.port());
    let b = long_session(&format!("127.0.0.1:{}", proxy.port())).await;
    let dir = b.lock_path("job").unwrap();
    let g = b.lock("job").await.unwrap();
    let admin = raw(&server).await;
    let held = only_node(&admin, &dir).await;
    await_watchers(&server, &held, 1).await;
    // Another lock's create loses its reply: the connection drops and comes back.
    proxy.reset_reply_to(zk_request(CREATE2));
    let _ = b.lock("other").await;
    admin.delete(&held, None).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), g.lost())
        .await
        .expect("lost() fired on the deletion, the watch living through the reconnection");
}
