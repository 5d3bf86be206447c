//! The lock engine on one deployment: the shared `Core` (the backend, the registry of
//! what each scope holds, the watchdog), the acquisition loop, the guard, per-call
//! options and requests, and `backend.rs`, the only file here that calls Redis.
//!
//! Arrows point one way: `acquire` and the guard build on `Core`, which builds on the
//! registry, the watchdog and the backend; the backend builds on the client room
//! ([`crate::client`]). The facade (`LockClient`, in [`crate::facade`]) builds on this.

mod acquire;
mod backend;
pub(crate) mod core;
mod guard;
mod options;
pub(crate) mod registry;
mod request;
mod watchdog;

pub(crate) use guard::release_outcome;
pub use guard::{LockGuard, Released};
pub use options::LockOptions;
pub(crate) use request::{Request, Resolved};
