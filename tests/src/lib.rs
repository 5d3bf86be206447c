//! Test harness for the workspace's integration suites: real, throw-away
//! `redis-server` processes that a test can kill, restart, pause and watch.
//!
//! Every [`RedisServer`] is a private `redis-server` child process listening on
//! its own `127.0.0.1` port, with persistence switched off (`--save ""`,
//! `--appendonly no`) and a fresh temporary working directory that also holds
//! the server log. Nothing is shared between tests, so suites can run in
//! parallel, and nothing outlives the test: dropping the value kills the
//! process and removes the directory (on Linux the child is additionally tied
//! to the test process with `PR_SET_PDEATHSIG`, so even a test binary that is
//! killed outright does not leak servers).
//!
//! Failure injection:
//!
//! * [`RedisServer::kill`] / [`RedisServer::restart`]: crash the server
//!   (`SIGKILL`, all data lost) and bring it back on the same port;
//! * [`RedisServer::pause`] / [`RedisServer::resume`]: freeze the process with
//!   `SIGSTOP`/`SIGCONT`. Connections still succeed (the kernel completes the
//!   handshake) but nothing is answered, which is how a hung or partitioned
//!   server looks to a client;
//! * [`TcpProxy`]: a proxy between one client and the server whose
//!   [`cut`](TcpProxy::cut) / [`heal`](TcpProxy::heal) partition that
//!   client alone, silently (no RST/FIN), while the server and its other
//!   clients carry on.
//!
//! Observation: [`RedisServer::connection`] gives a plain connection for
//! assertions (`HGET`, `EXISTS`, `PTTL`, ...), and [`RedisServer::monitor`]
//! records every command the server executes, to assert that some kind of
//! traffic did (or did not) happen.
//!
//! Several servers:
//!
//! * [`RedisMasters`] (or [`RedisServer::start_many`]): `n` independent
//!   servers started in parallel, each a [`RedisServer`] with all of the
//!   above, for algorithms that lock on several masters;
//! * [`RedisCluster`]: a real Redis Cluster (`--cluster-enabled yes`) of
//!   masters with optional replicas, formed with `CLUSTER ADDSLOTSRANGE` /
//!   `MEET` / `REPLICATE` and waited for until every node reports
//!   `cluster_state:ok`. It tells which master serves a key
//!   ([`RedisCluster::master_for_key`], [`key_slot`]), promotes replicas
//!   ([`RedisCluster::failover`] with a [`FailoverMode`]), kills, restarts and
//!   pauses nodes, and can cut a replica off its master
//!   ([`RedisCluster::break_replication`]) so that a `TAKEOVER` loses the
//!   writes made meanwhile. [`RedisCluster::connection`] is a
//!   `redis::cluster_async::ClusterConnection` that follows `MOVED`.
//!
//! The binary is taken from the `REDIS_SERVER_BIN` environment variable, or
//! `redis-server` on `PATH` (`scripts/ensure-redis` installs it). Starting and
//! restarting block the calling thread until the server answers `PING`,
//! usually for a few milliseconds.
//!
//! ```
//! use lock_tests::RedisServer;
//!
//! let mut server = RedisServer::start();
//! assert_eq!(server.url(), format!("redis://127.0.0.1:{}/", server.port()));
//! server.kill();
//! server.restart();
//! assert!(server.log().contains("Ready to accept connections"));
//! ```

mod cluster;
mod etcd;
mod mariadb;
mod masters;
mod monitor;
mod port;
mod postgres;
mod process;
mod proxy;
mod rabbitmq;
mod server;
mod zookeeper;

pub use cluster::{
    CLUSTER_NODE_TIMEOUT, CLUSTER_SLOTS, ClusterNode, FailoverMode, RedisCluster, Role, key_slot,
};
pub use etcd::EtcdCluster;
pub use mariadb::MariaDbServer;
pub use masters::RedisMasters;
pub use monitor::Monitor;
pub use port::free_port;
pub use postgres::PostgresServer;
pub use proxy::TcpProxy;
pub use rabbitmq::RabbitMqServer;
pub use server::{RedisServer, connect};
pub use zookeeper::ZooKeeperServer;

/// The README's code blocks, compiled as doctests so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
