//! What every lock store promises, checked on each: one API opened from a URL, the
//! randomized model, and mutual exclusion across processes.

#[path = "../common/mod.rs"]
mod common;

mod across_processes;
mod any_locks;
mod arrival_order;
mod election;
mod fair_line;
mod model;
mod read_write;
