//! The lock stores that are not Redis, each on a real server the harness starts:
//! PostgreSQL, MySQL (MariaDB), ZooKeeper, etcd, and the database stores' faults.

#[path = "../common/mod.rs"]
mod common;

mod checks;
mod etcd;
mod mysql;
mod postgres;
mod sql_faults;
mod zookeeper;
