//! [`RedisCluster`]: a real Redis Cluster made of private `redis-server`
//! processes, with manual failover and replication breaking for tests.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::ops::{Index, RangeInclusive};
use std::time::{Duration, Instant};

use crate::RedisServer;
use crate::port::free_port;
use crate::server::{default_bin, start_parallel};

/// Number of hash slots in a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16_384;

/// `cluster-node-timeout` of the harness's clusters: a node that does not
/// answer for this long is suspected down (and a dead master is replaced by
/// its replica after about twice this).
pub const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_millis(1_000);

/// How long [`RedisCluster::start`] waits for the cluster to form.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a failover or [`RedisCluster::wait_stable`] may take.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Timeouts of the harness's own admin connections.
const ADMIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const ADMIN_IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval between two looks at the cluster while waiting for a condition.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The `masterauth` that [`RedisCluster::break_replication`] sets.
const WRONG_MASTERAUTH: &str = "lock-tests-wrong-masterauth";

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its hash tag
/// (the part between the first `{` and the next `}`, if not empty), modulo
/// [`CLUSTER_SLOTS`]. The same as the server's `CLUSTER KEYSLOT`.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(key);
    crc16_xmodem(hashed) % CLUSTER_SLOTS
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// How [`RedisCluster::failover`] promotes a replica (the variants of
/// `CLUSTER FAILOVER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailoverMode {
    /// `CLUSTER FAILOVER`: the master stops taking writes, the replica
    /// catches up with its replication stream, then takes over. No write is
    /// lost; needs the master up and replication working.
    #[default]
    Coordinated,
    /// `CLUSTER FAILOVER FORCE`: no handshake with the master (it may be
    /// down), but the other masters still vote.
    Force,
    /// `CLUSTER FAILOVER TAKEOVER`: the replica promotes itself without
    /// asking anyone. Writes it has not received are lost.
    Takeover,
}

/// A node's role, as a [`ClusterNode`] snapshot reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A master (it may own no slots).
    Master,
    /// A replica of the node with this index.
    Replica {
        /// Index (into [`RedisCluster::node`]) of its master.
        master: usize,
    },
}

/// A snapshot of one node, from [`RedisCluster::nodes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// Position in the cluster; stable for the cluster's lifetime.
    pub index: usize,
    /// Client port on `127.0.0.1`; stable across restarts.
    pub port: u16,
    /// The 40-character cluster node id; stable across restarts.
    pub id: String,
    /// Master or replica, as of the snapshot.
    pub role: Role,
    /// The slot ranges it serves (empty for replicas).
    pub slots: Vec<RangeInclusive<u16>>,
}

/// A Redis Cluster of `masters × (1 + replicas_per_master)` private
/// `redis-server` processes on `127.0.0.1`, each a [`RedisServer`] started
/// with `--cluster-enabled yes`, its own `nodes-<port>.conf` in its own temp
/// dir, a separate free bus port, a [`CLUSTER_NODE_TIMEOUT`] node timeout
/// and no persistence.
///
/// Nodes are addressed by index: `0..masters` start as masters with the
/// slots split evenly in order, the replicas follow (replica `k` of master
/// `m` has index `masters + m * replicas_per_master + k`). Roles change with
/// failovers; [`nodes`](Self::nodes), [`master_for_key`](Self::master_for_key)
/// and [`replica_of`](Self::replica_of) ask the servers.
///
/// Every method except [`connection`](Self::connection) is blocking (fresh
/// admin connections, polling every 20 ms up to a deadline), like
/// [`RedisServer::start`]; use a multi-threaded runtime when a cluster
/// connection must make progress meanwhile.
///
/// Dropping it kills every process and removes the directories (printing
/// every node's log if the test is panicking).
///
/// ```no_run
/// # async fn demo() {
/// use lock_tests::{FailoverMode, RedisCluster};
/// use redis::AsyncCommands;
///
/// let cluster = RedisCluster::start(3, 1);
/// let mut conn = cluster.connection().await;
/// let () = conn.set("k", "v").await.unwrap();
/// let master = cluster.master_for_key("k");
/// let replica = cluster.replica_of(master);
/// cluster.failover(replica, FailoverMode::Coordinated);
/// assert_eq!(cluster.master_for_key("k"), replica);
/// # }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Cluster bus port of each node.
    bus_ports: Vec<u16>,
    /// Node id of each node (kept across restarts by `nodes-<port>.conf`).
    ids: Vec<String>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas_per_master` replicas each,
    /// all processes in parallel, then forms the cluster with plain
    /// commands (`CLUSTER SET-CONFIG-EPOCH` and `CLUSTER ADDSLOTSRANGE` on
    /// the masters, `CLUSTER MEET`, `CLUSTER REPLICATE`) and waits until it
    /// is [stable](Self::wait_stable): every node reports `cluster_state:ok`,
    /// agrees on who serves all 16384 slots, and every replica's link to its
    /// master is up. Takes about two seconds (a new master waits 2 s before
    /// it declares the cluster ok).
    ///
    /// # Panics
    ///
    /// If `masters` is 0, a node does not come up (the message names its
    /// port and includes its log), or the cluster does not form within 30 s
    /// (the message says what was missing; every node's log follows).
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        Self::start_with_args(masters, replicas_per_master, &[])
    }

    /// Like [`start`](Self::start), with extra arguments for every node,
    /// after the harness's own (so e.g. `["--cluster-node-timeout", "5000"]`
    /// overrides the default). Do not override the port, bus port, directory
    /// or cluster config file.
    pub fn start_with_args(
        masters: usize,
        replicas_per_master: usize,
        args: &[&str],
    ) -> RedisCluster {
        assert!(masters > 0, "a cluster needs at least one master");
        let total = masters * (1 + replicas_per_master);
        let bin = default_bin();
        let node_timeout = CLUSTER_NODE_TIMEOUT.as_millis().to_string();
        let extra: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let started = start_parallel(total, |_| {
            RedisServer::start_configured(bin.clone(), |port| {
                let mut args: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &format!("nodes-{port}.conf"),
                    "--cluster-port",
                    &free_port().to_string(),
                    "--cluster-node-timeout",
                    &node_timeout,
                    // Full syncs start at once instead of after 5 s.
                    "--repl-diskless-sync-delay",
                    "0",
                ]
                .iter()
                .map(|a| a.to_string())
                .collect();
                args.extend(extra.iter().cloned());
                args
            })
        });
        let mut cluster = RedisCluster {
            bus_ports: started.iter().map(bus_port_of).collect(),
            ids: Vec::with_capacity(total),
            nodes: started,
        };
        for i in 0..total {
            let id: String = cluster.admin(i, &["CLUSTER", "MYID"]);
            cluster.ids.push(id);
        }
        for m in 0..masters {
            let first = usize::from(CLUSTER_SLOTS) * m / masters;
            let end = usize::from(CLUSTER_SLOTS) * (m + 1) / masters - 1;
            let epoch = (m + 1).to_string();
            let () = cluster.admin(m, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]);
            let (first, end) = (first.to_string(), end.to_string());
            let () = cluster.admin(m, &["CLUSTER", "ADDSLOTSRANGE", &first, &end]);
        }
        let (port0, bus0) = (cluster.nodes[0].port().to_string(), cluster.bus_ports[0]);
        for i in 1..total {
            let bus0 = bus0.to_string();
            let () = cluster.admin(i, &["CLUSTER", "MEET", "127.0.0.1", &port0, &bus0]);
        }
        cluster.wait_until("every node knows every other node", FORM_TIMEOUT, |c| {
            c.running().try_for_each(|i| {
                let view = c.view(i)?;
                let known = view.iter().filter(|l| l.ready()).count();
                if known == total {
                    Ok(())
                } else {
                    Err(format!("node {} knows {known} of {total}", c.describe(i)))
                }
            })
        });
        for m in 0..masters {
            for k in 0..replicas_per_master {
                let replica = masters + m * replicas_per_master + k;
                let master_id = cluster.ids[m].clone();
                let () = cluster.admin(replica, &["CLUSTER", "REPLICATE", &master_id]);
            }
        }
        cluster.wait_stable_within(FORM_TIMEOUT);
        cluster
    }

    /// Number of nodes (masters and replicas).
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the cluster has no nodes (never true: [`start`](Self::start)
    /// needs a master).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `index` as a plain [`RedisServer`], e.g. for
    /// [`connection`](RedisServer::connection) (a replica answers reads only
    /// after `READONLY`; keys of other masters' slots get `MOVED`),
    /// [`log`](RedisServer::log) or [`port`](RedisServer::port).
    pub fn node(&self, index: usize) -> &RedisServer {
        &self.nodes[index]
    }

    /// The cluster node id of node `index`.
    pub fn node_id(&self, index: usize) -> &str {
        &self.ids[index]
    }

    /// `redis://127.0.0.1:PORT/` of every node, in index order: seed URLs
    /// for [`redis::cluster::ClusterClient`].
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `127.0.0.1:PORT` of every node, comma-separated, in index order: the host list of
    /// a `redis+cluster://` (or `redisson+cluster://`) URL.
    pub fn hosts(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// URLs of the nodes that currently serve slots, in index order.
    pub fn master_urls(&self) -> Vec<String> {
        self.masters()
            .into_iter()
            .map(|i| self.nodes[i].url())
            .collect()
    }

    /// A cluster client seeded with every node's URL, with 5 s connection
    /// and 10 s response timeouts (generous, so assertions do not flake on
    /// a loaded machine).
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::builder(self.urls())
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(10))
            .build()
            .expect("the node URLs are valid")
    }

    /// An async cluster connection from [`client`](Self::client); it follows
    /// `MOVED`/`ASK` redirections.
    ///
    /// # Panics
    ///
    /// If no node can be reached.
    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        self.client()
            .get_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the cluster {:?}: {e}", self.urls()))
    }

    /// A snapshot of every node: port, id, role and slots. Each running node
    /// describes itself; killed or paused nodes are described by the first
    /// running node that knows them.
    ///
    /// # Panics
    ///
    /// If no node is running, or a running node does not answer `CLUSTER NODES`.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        let views: HashMap<usize, Vec<NodeLine>> = self
            .running()
            .map(|i| (i, self.view(i).unwrap_or_else(|e| panic!("{e}"))))
            .collect();
        assert!(!views.is_empty(), "no cluster node is running");
        (0..self.len())
            .map(|index| {
                let line = views
                    .get(&index)
                    .and_then(|view| view.iter().find(|l| l.myself))
                    .or_else(|| views.values().flatten().find(|l| l.id == self.ids[index]))
                    .unwrap_or_else(|| {
                        panic!("no running node knows node {}", self.describe(index))
                    });
                let role = match &line.master_id {
                    Some(master) => Role::Replica {
                        master: self.index_of(master),
                    },
                    None => Role::Master,
                };
                ClusterNode {
                    index,
                    port: self.nodes[index].port(),
                    id: self.ids[index].clone(),
                    role,
                    slots: line.slots.iter().map(|&(a, b)| a..=b).collect(),
                }
            })
            .collect()
    }

    /// Indices of the nodes that serve slots now, ascending.
    pub fn masters(&self) -> Vec<usize> {
        let mut masters: Vec<usize> = self.slot_map().into_iter().map(|(_, _, m)| m).collect();
        masters.sort_unstable();
        masters.dedup();
        masters
    }

    /// Index of the master serving `slot`, as the first running node sees it.
    ///
    /// # Panics
    ///
    /// If `slot >= 16384`, no node is running, or nobody serves the slot.
    pub fn master_for_slot(&self, slot: u16) -> usize {
        assert!(slot < CLUSTER_SLOTS, "slot {slot} out of range");
        self.slot_map()
            .into_iter()
            .find(|&(first, last, _)| (first..=last).contains(&slot))
            .map(|(_, _, master)| master)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Index of the master serving `key` (see [`key_slot`]).
    pub fn master_for_key(&self, key: impl AsRef<[u8]>) -> usize {
        self.master_for_slot(key_slot(key))
    }

    /// Indices of the replicas of node `master`, as they report themselves
    /// (killed or paused replicas as the first running node sees them).
    pub fn replicas_of(&self, master: usize) -> Vec<usize> {
        self.nodes()
            .into_iter()
            .filter(|n| n.role == Role::Replica { master })
            .map(|n| n.index)
            .collect()
    }

    /// The first of [`replicas_of`](Self::replicas_of)`(master)`.
    ///
    /// # Panics
    ///
    /// If `master` has no replica.
    pub fn replica_of(&self, master: usize) -> usize {
        self.replicas_of(master)
            .first()
            .copied()
            .unwrap_or_else(|| panic!("node {} has no replica", self.describe(master)))
    }

    /// Promotes replica `replica` with `CLUSTER FAILOVER` in the given
    /// `mode`, and waits (up to 20 s) until it reports itself master of the
    /// slots its master served, the old master (if running) reports itself
    /// its replica, and every running, unpaused node agrees on the slot map
    /// and on who replicates whom. (It does not wait for the old master to
    /// finish re-syncing: [`wait_stable`](Self::wait_stable) does.)
    ///
    /// # Panics
    ///
    /// If the node is not a replica, the command is refused, or the
    /// failover does not complete in time (a [`Coordinated`](FailoverMode::Coordinated)
    /// failover cannot complete when replication is broken or the master is
    /// down: use [`Takeover`](FailoverMode::Takeover)).
    pub fn failover(&self, replica: usize, mode: FailoverMode) {
        let me = self.own_line(replica).unwrap_or_else(|e| panic!("{e}"));
        let Some(master_id) = me.master_id else {
            panic!(
                "cannot fail over to node {}: it is not a replica",
                self.describe(replica)
            )
        };
        let master = self.index_of(&master_id);
        let slots = self
            .own_line(master)
            .map(|l| l.slots)
            .or_else(|_| self.view(replica).map(|v| slots_of(&v, &master_id)))
            .unwrap_or_else(|e| panic!("{e}"));
        let mut args = vec!["CLUSTER", "FAILOVER"];
        match mode {
            FailoverMode::Coordinated => {}
            FailoverMode::Force => args.push("FORCE"),
            FailoverMode::Takeover => args.push("TAKEOVER"),
        }
        let () = self.admin(replica, &args);
        let what = format!(
            "{} (`{}`) takes over slots {slots:?} from {} and every node agrees",
            self.describe(replica),
            args.join(" "),
            self.describe(master)
        );
        self.wait_until(&what, SETTLE_TIMEOUT, |c| {
            let me = c.own_line(replica)?;
            if me.master_id.is_some() {
                return Err(format!("{} is still a replica", c.describe(replica)));
            }
            if me.slots != slots {
                return Err(format!("it serves {:?}", me.slots));
            }
            if c.running().any(|i| i == master) {
                let old = c.own_line(master)?;
                if old.master_id.as_deref() != Some(c.ids[replica].as_str()) {
                    return Err(format!(
                        "the old master {} does not replicate it yet",
                        c.describe(master)
                    ));
                }
            }
            c.agreed_topology().map(|_| ())
        });
    }

    /// Makes replica `replica` stop receiving its master's writes, for
    /// "write lost on failover" tests: sets a wrong `masterauth` on it and
    /// kills its replication link (`CLIENT KILL TYPE master`), so every
    /// attempt to re-sync fails with "Unable to AUTH to MASTER" (the harness
    /// servers have no password). Returns once the replica reports
    /// `master_link_status:down` and its log shows a refused re-sync
    /// attempt (about a second later). The cluster still sees it as a
    /// healthy replica; a later [`FailoverMode::Takeover`] promotes it
    /// without anything written to its master meanwhile.
    ///
    /// # Panics
    ///
    /// If the node is not a replica or the link does not go (and stay) down.
    pub fn break_replication(&self, replica: usize) {
        let me = self.own_line(replica).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            me.master_id.is_some(),
            "cannot break replication of node {}: it is not a replica",
            self.describe(replica)
        );
        let log_before = self.nodes[replica].log().len();
        let () = self.admin(replica, &["CONFIG", "SET", "masterauth", WRONG_MASTERAUTH]);
        let _killed: i64 = self.admin(replica, &["CLIENT", "KILL", "TYPE", "master"]);
        let what = format!(
            "replica {} loses its master link and fails to re-sync",
            self.describe(replica)
        );
        self.wait_until(&what, SETTLE_TIMEOUT, |c| {
            let link = c.replication_field(replica, "master_link_status")?;
            if link.as_deref() != Some("down") {
                return Err(format!("master_link_status:{link:?}"));
            }
            let log = c.nodes[replica].log();
            if !log[log_before.min(log.len())..].contains("Unable to AUTH to MASTER") {
                return Err("no refused re-sync attempt in its log yet".into());
            }
            Ok(())
        });
    }

    /// Undoes [`break_replication`](Self::break_replication): clears
    /// `masterauth` and waits until the replica's link is up again (it then
    /// re-syncs everything it missed).
    pub fn restore_replication(&self, replica: usize) {
        let () = self.admin(replica, &["CONFIG", "SET", "masterauth", ""]);
        let what = format!(
            "replica {} re-syncs with its master",
            self.describe(replica)
        );
        self.wait_until(&what, SETTLE_TIMEOUT, |c| {
            match c
                .replication_field(replica, "master_link_status")?
                .as_deref()
            {
                Some("up") => Ok(()),
                other => Err(format!("master_link_status:{other:?}")),
            }
        });
    }

    /// Kills node `index` with `SIGKILL` (see [`RedisServer::kill`]). If it
    /// was a master, its replica takes over after about two
    /// [`CLUSTER_NODE_TIMEOUT`]s; [`wait_stable`](Self::wait_stable) waits
    /// for that.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Restarts node `index` on the same ports with the same node id (its
    /// `nodes-<port>.conf` survives; its data does not). It rejoins the
    /// cluster by itself; [`wait_stable`](Self::wait_stable) waits for that.
    pub fn restart(&mut self, index: usize) {
        self.nodes[index].restart();
    }

    /// Freezes node `index` with `SIGSTOP` (see [`RedisServer::pause`]).
    /// Longer than [`CLUSTER_NODE_TIMEOUT`] and the others consider it down.
    pub fn pause(&self, index: usize) {
        self.nodes[index].pause();
    }

    /// Continues node `index` after [`pause`](Self::pause).
    pub fn resume(&self, index: usize) {
        self.nodes[index].resume();
    }

    /// Waits (up to 20 s) until the running, unpaused nodes form a healthy
    /// cluster: each reports `cluster_state:ok`; all agree on which master
    /// serves each of the 16384 slots (none of them down: flagged failed, or
    /// killed or paused by the harness) and on who replicates whom; and
    /// each replica whose master is running reports `master_link_status:up`.
    /// After a master is [killed](Self::kill) this waits for its replica to
    /// take over.
    ///
    /// # Panics
    ///
    /// If that does not happen in time, saying what was still missing.
    pub fn wait_stable(&self) {
        self.wait_stable_within(SETTLE_TIMEOUT);
    }

    fn wait_stable_within(&self, timeout: Duration) {
        self.wait_until("the cluster is stable", timeout, |c| {
            for i in c.running() {
                match c
                    .info_field(i, &["CLUSTER", "INFO"], "cluster_state")?
                    .as_deref()
                {
                    Some("ok") => {}
                    other => {
                        return Err(format!(
                            "node {} has cluster_state {other:?}",
                            c.describe(i)
                        ));
                    }
                }
            }
            c.agreed_topology()?;
            for i in c.running() {
                let Some(master_id) = c.own_line(i)?.master_id else {
                    continue;
                };
                let master = c.index_of(&master_id);
                if !c.running().any(|i| i == master) {
                    continue;
                }
                let link = c.replication_field(i, "master_link_status")?;
                if link.as_deref() != Some("up") {
                    return Err(format!(
                        "replica {} has master_link_status {link:?}",
                        c.describe(i)
                    ));
                }
            }
            Ok(())
        });
    }

    /// Indices of nodes that are running and not paused (they can answer).
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&i| self.nodes[i].is_running() && !self.nodes[i].is_paused())
    }

    /// `127.0.0.1:PORT (id abcdef12)` for messages.
    fn describe(&self, index: usize) -> String {
        let id = self.ids.get(index).map_or("?", |id| &id[..8.min(id.len())]);
        format!("#{index} 127.0.0.1:{} (id {id})", self.nodes[index].port())
    }

    fn index_of(&self, id: &str) -> usize {
        self.ids
            .iter()
            .position(|known| known == id)
            .unwrap_or_else(|| panic!("unknown cluster node id {id}"))
    }

    /// A fresh blocking admin connection to node `index`.
    fn connect(&self, index: usize) -> Result<redis::Connection, String> {
        let node = &self.nodes[index];
        let connection = node
            .client()
            .get_connection_with_timeout(ADMIN_CONNECT_TIMEOUT)
            .and_then(|c| {
                c.set_read_timeout(Some(ADMIN_IO_TIMEOUT))?;
                c.set_write_timeout(Some(ADMIN_IO_TIMEOUT))?;
                Ok(c)
            });
        connection.map_err(|e| format!("cannot connect to node {}: {e}", self.describe(index)))
    }

    /// Runs one command on node `index`.
    fn try_admin<T: redis::FromRedisValue>(
        &self,
        index: usize,
        args: &[&str],
    ) -> Result<T, String> {
        let mut connection = self.connect(index)?;
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut connection)
            .map_err(|e| format!("`{}` on node {}: {e}", args.join(" "), self.describe(index)))
    }

    /// Runs one command on node `index`, panicking with the node and the
    /// command if it fails.
    fn admin<T: redis::FromRedisValue>(&self, index: usize, args: &[&str]) -> T {
        self.try_admin(index, args)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Node `index`'s `CLUSTER NODES`, parsed.
    fn view(&self, index: usize) -> Result<Vec<NodeLine>, String> {
        let text: String = self.try_admin(index, &["CLUSTER", "NODES"])?;
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                NodeLine::parse(l).ok_or_else(|| {
                    format!(
                        "node {}: cannot parse CLUSTER NODES line {l:?}",
                        self.describe(index)
                    )
                })
            })
            .collect()
    }

    /// The `myself` line of node `index`'s own view.
    fn own_line(&self, index: usize) -> Result<NodeLine, String> {
        self.view(index)?
            .into_iter()
            .find(|l| l.myself)
            .ok_or_else(|| format!("node {} has no myself line", self.describe(index)))
    }

    /// `field` from the `field:value` lines node `index` answers to
    /// `command` (`INFO replication`, `CLUSTER INFO`).
    fn info_field(
        &self,
        index: usize,
        command: &[&str],
        field: &str,
    ) -> Result<Option<String>, String> {
        let text: String = self.try_admin(index, command)?;
        Ok(text.lines().find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')
                .map(|v| v.trim().to_owned())
        }))
    }

    fn replication_field(&self, index: usize, field: &str) -> Result<Option<String>, String> {
        self.info_field(index, &["INFO", "replication"], field)
    }

    /// `(first, last, master index)` ranges, as the first running node sees them.
    fn slot_map(&self) -> Vec<(u16, u16, usize)> {
        let observer = self.running().next().expect("no cluster node is running");
        let view = self.view(observer).unwrap_or_else(|e| panic!("{e}"));
        self.slot_map_of(&view)
    }

    fn slot_map_of(&self, view: &[NodeLine]) -> Vec<(u16, u16, usize)> {
        let mut map: Vec<(u16, u16, usize)> = view
            .iter()
            .filter(|l| l.master_id.is_none())
            .flat_map(|l| {
                let owner = self.index_of(&l.id);
                l.slots.iter().map(move |&(a, b)| (a, b, owner))
            })
            .collect();
        map.sort_unstable();
        map
    }

    /// The cluster's layout (slot map, and who replicates whom among the
    /// running nodes), if every running node sees the same one, every slot
    /// is served, and no slot is served by a node flagged as failed or
    /// killed or paused by the harness.
    fn agreed_topology(&self) -> Result<Topology, String> {
        let running: Vec<usize> = self.running().collect();
        let mut agreed: Option<(usize, Topology)> = None;
        for &i in &running {
            let view = self.view(i)?;
            let slots = self.slot_map_of(&view);
            if let Some(&(a, b, owner)) = slots.iter().find(|&&(_, _, owner)| {
                !running.contains(&owner)
                    || view.iter().any(|l| l.failed && l.id == self.ids[owner])
            }) {
                return Err(format!(
                    "node {} sees slots {a}-{b} served by node {}, which is down",
                    self.describe(i),
                    self.describe(owner)
                ));
            }
            let covered: u32 = slots.iter().map(|&(a, b, _)| u32::from(b - a) + 1).sum();
            if covered != u32::from(CLUSTER_SLOTS) {
                return Err(format!(
                    "node {} sees {covered} of {CLUSTER_SLOTS} slots served",
                    self.describe(i)
                ));
            }
            let mut replication = Vec::new();
            for &node in &running {
                let line = view
                    .iter()
                    .find(|l| l.id == self.ids[node])
                    .ok_or_else(|| {
                        format!(
                            "node {} does not know node {}",
                            self.describe(i),
                            self.describe(node)
                        )
                    })?;
                let master = line.master_id.as_deref().map(|m| self.index_of(m));
                replication.push((node, master));
            }
            let topology = Topology { slots, replication };
            match &agreed {
                None => agreed = Some((i, topology)),
                Some((first, expected)) if *expected != topology => {
                    return Err(format!(
                        "nodes disagree: {} sees {}, {} sees {}",
                        self.describe(*first),
                        self.format_topology(expected),
                        self.describe(i),
                        self.format_topology(&topology)
                    ));
                }
                Some(_) => {}
            }
        }
        agreed
            .map(|(_, topology)| topology)
            .ok_or_else(|| "no cluster node is running".into())
    }

    fn format_topology(&self, topology: &Topology) -> String {
        let mut text = self.format_map(&topology.slots);
        for &(node, master) in &topology.replication {
            if let Some(master) = master {
                let _ = write!(text, " #{node}→replica of #{master}");
            }
        }
        text
    }

    fn format_map(&self, map: &[(u16, u16, usize)]) -> String {
        let mut text = String::new();
        for &(a, b, m) in map {
            let _ = write!(text, "[{a}-{b} → #{m}]");
        }
        text
    }

    /// Polls `check` every 20 ms until it returns `Ok`, panicking after
    /// `timeout` with `what` and the last reason `check` gave.
    fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Self) -> Result<T, String>,
    ) -> T {
        let deadline = Instant::now() + timeout;
        loop {
            match check(self) {
                Ok(value) => return value,
                Err(reason) if Instant::now() >= deadline => {
                    panic!("timed out after {timeout:?} waiting until {what}; last seen: {reason}")
                }
                Err(_) => std::thread::sleep(POLL_INTERVAL),
            }
        }
    }
}

impl Index<usize> for RedisCluster {
    type Output = RedisServer;

    /// Same as [`RedisCluster::node`].
    fn index(&self, index: usize) -> &RedisServer {
        self.node(index)
    }
}

/// What [`RedisCluster::agreed_topology`] compares between the nodes' views.
#[derive(Debug, PartialEq, Eq)]
struct Topology {
    /// `(first, last, master index)`, ascending.
    slots: Vec<(u16, u16, usize)>,
    /// `(node, master of node)` for every running node, by index.
    replication: Vec<(usize, Option<usize>)>,
}

/// The `--cluster-port` a node was started with.
fn bus_port_of(server: &RedisServer) -> u16 {
    server
        .args()
        .windows(2)
        .find(|pair| pair[0] == "--cluster-port")
        .and_then(|pair| pair[1].parse().ok())
        .expect("cluster nodes are started with --cluster-port")
}

/// The slots served by `id` in `view`.
fn slots_of(view: &[NodeLine], id: &str) -> Vec<(u16, u16)> {
    view.iter()
        .find(|l| l.id == id)
        .map(|l| l.slots.clone())
        .unwrap_or_default()
}

/// One line of `CLUSTER NODES`:
/// `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...`.
#[derive(Debug, Clone)]
struct NodeLine {
    id: String,
    myself: bool,
    /// `fail` (not just `fail?`).
    failed: bool,
    /// Still in the handshake, or its address is unknown.
    pending: bool,
    /// For replicas, the id of their master.
    master_id: Option<String>,
    /// Served slot ranges, ascending; importing/migrating markers skipped.
    slots: Vec<(u16, u16)>,
}

impl NodeLine {
    fn parse(line: &str) -> Option<NodeLine> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [
            id,
            _addr,
            flags,
            master,
            _ping,
            _pong,
            _epoch,
            _link,
            slots @ ..,
        ] = &fields[..]
        else {
            return None;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        let mut ranges = Vec::new();
        for slot in slots.iter().filter(|s| !s.starts_with('[')) {
            let (a, b) = slot.split_once('-').unwrap_or((slot, slot));
            ranges.push((a.parse().ok()?, b.parse().ok()?));
        }
        ranges.sort_unstable();
        Some(NodeLine {
            id: (*id).to_owned(),
            myself: flags.contains(&"myself"),
            failed: flags.contains(&"fail"),
            pending: flags.contains(&"handshake") || flags.contains(&"noaddr"),
            master_id: (flags.contains(&"slave") && *master != "-").then(|| (*master).to_owned()),
            slots: ranges,
        })
    }

    /// Known by id, with an address, past the handshake.
    fn ready(&self) -> bool {
        !self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_reference_value() {
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
    }

    #[test]
    fn key_slot_uses_the_hash_tag() {
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
    }
}
