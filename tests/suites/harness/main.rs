//! Self-tests of the `lock-tests` harness: the servers it starts and the faults it
//! injects do what the other suites rely on.

mod cluster;
mod proxy;
mod server;
