//! Read-write locks in the layout of Curator's `InterProcessReadWriteLock`: a contender
//! made by hand as Curator makes one (`_c_<uuid>-__READ__<seq>`, `_c_<uuid>-__WRIT__<seq>`
//! under the lock's path) is honoured by ours, and ours are what a Curator client reads.

use std::time::Duration;

use crate::checks;
use lock_core::LockOptions;
use lock_core::zookeeper_client as zk;
use lock_tests::ZooKeeperServer;

use super::{locks, raw};

/// A Java contender's node of `kind` (`__READ__` or `__WRIT__`) in `dir`: its path.
async fn java_node(java: &zk::Client, dir: &str, kind: &str) -> String {
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    let _ = java.mkdir(dir, &persistent).await;
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{dir}/_c_0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9-{kind}");
    let (_, seq) = java.create(&prefix, b"10.0.0.9", &ephemeral).await.unwrap();
    format!("{prefix}{seq}")
}

fn seq(node: &str) -> &str {
    &node[node.len() - 10..]
}

/// Curator's read predicate for the reader `node` of `dir` as a Java client computes
/// it: granted unless a write node sorts before it.
async fn java_reader_granted(java: &zk::Client, dir: &str, node: &str) -> bool {
    let children = java.list_children(dir).await.unwrap();
    !children
        .iter()
        .any(|c| c.contains("__WRIT__") && seq(c) < seq(node))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_writer_excludes_us_and_wakes_our_reader() {
    let server = ZooKeeperServer::start();
    let locks = locks(&server).await;
    let dir = locks.lock_path("catalog").unwrap();
    let java = raw(&server).await;
    let writer = java_node(&java, &dir, "__WRIT__").await;

    checks::read_and_write_busy(&locks, "catalog").await;
    let reader = checks::waiting(&locks, "catalog", LockOptions::new().read());
    crate::common::eventually(Duration::from_secs(5), "our reader queued", || async {
        let children = java.list_children(&dir).await.unwrap();
        children.iter().any(|c| c.contains("__READ__"))
    })
    .await;
    let ours = java.list_children(&dir).await.unwrap();
    let ours = ours.iter().find(|c| c.contains("__READ__")).unwrap();
    assert!(
        ours.starts_with("_c_") && ours.len() == 3 + 36 + 9 + 10,
        "Curator's naming: {ours}"
    );
    assert!(!reader.is_finished(), "granted beside a Curator writer");
    java.delete(&writer, None).await.unwrap();
    let g = checks::granted(reader, "woken by the writer's deletion").await;
    assert!(g.is_held());
    assert!(g.fencing_token().is_none(), "readers are not fenced");
    g.release().await.unwrap();
    assert!(java.list_children(&dir).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_reader_shares_with_ours_and_our_waiting_writer_holds_curator_readers_back() {
    let server = ZooKeeperServer::start();
    let locks = locks(&server).await;
    let dir = locks.lock_path("catalog").unwrap();
    let java = raw(&server).await;
    let java_reader = java_node(&java, &dir, "__READ__").await;

    checks::a_reader_shares_and_the_writer_is_busy(&locks, "catalog").await;

    // Our writer queues behind the Java reader...
    let writer = checks::waiting(&locks, "catalog", LockOptions::new().write());
    crate::common::eventually(Duration::from_secs(5), "our writer queued", || async {
        let children = java.list_children(&dir).await.unwrap();
        children.iter().any(|c| c.contains("__WRIT__"))
    })
    .await;
    // ...and a Java reader that comes now waits for it, by Curator's own predicate.
    let late_reader = java_node(&java, &dir, "__READ__").await;
    assert!(!java_reader_granted(&java, &dir, &late_reader).await);
    assert!(java_reader_granted(&java, &dir, &java_reader).await);
    java.delete(&late_reader, None).await.unwrap();

    assert!(!writer.is_finished(), "granted beside a Curator reader");
    java.delete(&java_reader, None).await.unwrap();
    let w = checks::granted(writer, "woken by the reader's deletion").await;
    assert!(
        w.fencing_token().is_some(),
        "a writer is fenced by its node's zxid"
    );
    // While ours writes, a Java reader waits.
    let blocked = java_node(&java, &dir, "__READ__").await;
    assert!(!java_reader_granted(&java, &dir, &blocked).await);
    w.release().await.unwrap();
    assert!(java_reader_granted(&java, &dir, &blocked).await);
    java.delete(&blocked, None).await.unwrap();
}
