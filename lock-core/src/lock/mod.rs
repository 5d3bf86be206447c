//! The lock engine, once for every store: the shared `Core` (the backend, the
//! registry of what each scope holds, the watchdog), the acquisition loop, the guard,
//! per-call options and requests, and the seam (`seam.rs`) that each store implements
//! in [`crate::backends`]. Nothing here names a store.
//!
//! Arrows point one way: `acquire` and the guard build on `Core`, which builds on the
//! registry, the watchdog and the seam; the seam names only the client room's types
//! ([`crate::client`]). The facades (`LockClient`, `MemoryLocks`) build on this.

mod acquire;
pub(crate) mod core;
mod guard;
mod options;
pub(crate) mod registry;
mod request;
pub(crate) mod seam;
mod watchdog;

pub(crate) use guard::release_outcome;
pub use guard::{LockGuard, Released};
pub use options::LockOptions;
pub(crate) use request::{Request, Resolved};
