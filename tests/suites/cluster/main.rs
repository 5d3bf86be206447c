//! `LockClient` on real Redis Clusters the harness forms.

#[path = "../common/mod.rs"]
mod common;

mod locks;
mod lost_replies;
mod migration;
