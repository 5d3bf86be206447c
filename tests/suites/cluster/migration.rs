//! A slot migrating between two masters (`CLUSTER SETSLOT ... IMPORTING` and
//! `MIGRATING`): a call sent on with `-ASK` gets the importing node's own reply, and a
//! batch's commands each follow their own redirection, once.

use lock_tests::RedisCluster;

use super::locks::{client, config, names_on_one_slot, one_batch};

/// A slot's migration from its master to another.
struct Migration<'c> {
    cluster: &'c RedisCluster,
    slot: u16,
    source: usize,
    target: usize,
}

impl<'c> Migration<'c> {
    /// Starts moving `slot` to another master: importing there, migrating from here.
    async fn start(cluster: &'c RedisCluster, slot: u16) -> Self {
        let source = cluster.master_for_slot(slot);
        let target = cluster
            .masters()
            .into_iter()
            .find(|&m| m != source)
            .unwrap();
        let m = Self {
            cluster,
            slot,
            source,
            target,
        };
        m.set(target, "IMPORTING", source).await;
        m.set(source, "MIGRATING", target).await;
        m
    }

    /// `CLUSTER SETSLOT <slot> <state> <id of node>` on master `on`.
    async fn set(&self, on: usize, state: &str, node: usize) {
        let mut c = self.cluster.node(on).connection().await;
        let () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(self.slot)
            .arg(state)
            .arg(self.cluster.node_id(node))
            .query_async(&mut c)
            .await
            .unwrap();
    }

    /// Moves `key` to the importing master.
    async fn migrate(&self, key: &str) {
        let mut src = self.cluster.node(self.source).connection().await;
        let () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(self.cluster.node(self.target).port())
            .arg(key)
            .arg(0)
            .arg(5000)
            .query_async(&mut src)
            .await
            .unwrap();
    }

    /// The importing master's value of `key` (asked for with `ASKING`).
    async fn imported(&self, key: &str) -> Option<String> {
        let mut dst = self.cluster.node(self.target).connection().await;
        let (value,): (Option<String>,) = redis::pipe()
            .cmd("ASKING")
            .ignore()
            .cmd("GET")
            .arg(key)
            .query_async(&mut dst)
            .await
            .unwrap();
        value
    }

    /// Ends the migration: every master says the importing one owns the slot.
    async fn finish(&self) {
        for m in self.cluster.masters() {
            self.set(m, "NODE", self.target).await;
        }
    }
}

/// During a slot's migration a lock's key has moved to the importing node: a client
/// sent there by `-ASK` gets that node's own answer (busy), not the `+OK` of the
/// `ASKING` sent before it, and later calls on that connection get their own replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_slot_is_migrating_is_answered_by_the_importing_node() {
    let cluster = RedisCluster::start(3, 0);
    let a = client(&cluster, config()).await;
    let b = client(&cluster, config()).await;
    let held = a.try_lock("moving").await.unwrap();
    let key = held.keys().key.clone();
    let migration = Migration::start(&cluster, lock_tests::key_slot(&key)).await;
    migration.migrate(&key).await;
    // B's SET NX goes to the source, which sends it on with -ASK. The importing node
    // answers busy; what B asks next about the holder is a script, which a migrating
    // slot refuses (TRYAGAIN) until it has moved: either way, no grant.
    let err = b.try_lock("moving").await.map(drop).unwrap_err();
    assert!(err.is_busy() || err.is_unavailable(), "{err}");
    // Every reply still reaches its own call on B's connections.
    for i in 0..20 {
        let g = b.try_lock(("after", i)).await.unwrap();
        g.release().await.unwrap();
    }
    // The slot moved: the importing node owns it, and the lock is still A's.
    migration.finish().await;
    let err = b.try_lock("moving").await.map(drop).unwrap_err();
    assert!(err.is_busy(), "{err}");
    assert!(held.is_held());
    held.release().await.unwrap();
    b.try_lock("moving").await.unwrap().release().await.unwrap();
}

/// Acquisitions batched on a slot that is migrating: each follows its own redirection
/// (the free names are granted by the importing node), none is sent twice, and none
/// fails for another's redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_on_a_migrating_slot_follows_each_redirection_once() {
    let cluster = RedisCluster::start(3, 0);
    let c = client(&cluster, config().with_batches_in_flight(1)).await;
    let names = names_on_one_slot(&c, "m", 6);
    let slot = lock_tests::key_slot(c.keys(names[0]).unwrap().key);
    let migration = Migration::start(&cluster, slot).await;
    let mut guards = Vec::new();
    for (r, name) in one_batch(&cluster, &c, &names)
        .await
        .into_iter()
        .zip(&names)
    {
        guards.push(r.unwrap_or_else(|e| panic!("{name:?}: {e}")));
    }
    // Each key is on the importing node.
    for g in &guards {
        let key = &g.keys().key;
        assert!(
            migration.imported(key).await.is_some(),
            "{key}: not imported"
        );
    }
    // A release is a script, which a migrating slot refuses: the slot moves first.
    migration.finish().await;
    for g in guards {
        g.release().await.unwrap();
    }
}

/// A script call other than a lock's (here an idempotency claim's abandon) on a key
/// that has moved to the importing node follows its `-ASK` there: the claim is freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_on_a_moved_key_follows_its_redirection() {
    let cluster = RedisCluster::start(3, 0);
    let c = client(&cluster, config()).await;
    let store = c.idempotency_store("ask");
    let claim = match store
        .begin("order-1", "fp", std::time::Duration::from_secs(60))
        .await
        .unwrap()
    {
        lock_core::Begin::New(claim) => claim,
        other => panic!("a fresh key was not claimed: {other:?}"),
    };
    let record = claim.keys().record.clone();
    let migration = Migration::start(&cluster, lock_tests::key_slot(&record)).await;
    migration.migrate(&record).await;
    claim.abandon().await.unwrap();
    assert_eq!(
        migration.imported(&record).await,
        None,
        "the claim is still there"
    );
    migration.finish().await;
}
