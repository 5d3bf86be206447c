//! The lock stores that are not Redis, each on a real server the harness starts:
//! PostgreSQL, MySQL (MariaDB), ZooKeeper, etcd, the database stores' faults, and
//! Redisson's layout on Redis beside a Java contender made by hand.

#[path = "../common/mod.rs"]
mod common;

mod checks;
mod etcd;
mod mysql;
mod postgres;
mod redisson;
mod sql_faults;
mod zookeeper;
