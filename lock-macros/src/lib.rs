//! `#[cache_lock]`: a distributed lock held while an async fn runs, so that a
//! concurrent duplicate call (same key, any process) is refused before its body runs.
//!
//! ```no_run
//! use lock_core::{LockClient, LockError};
//! use lock_macros::cache_lock;
//!
//! #[derive(Debug)]
//! enum AppError {
//!     Lock(LockError),
//! }
//!
//! impl From<LockError> for AppError {
//!     fn from(e: LockError) -> Self {
//!         AppError::Lock(e)
//!     }
//! }
//!
//! #[cache_lock(prefix = "order", key = user_id, expire = "10s")]
//! async fn place_order(user_id: u64, voucher_id: u64) -> Result<u64, AppError> {
//!     // Only one call per user_id runs at a time, across every process sharing the
//!     // Redis; a concurrent duplicate gets `AppError::Lock(e)` with `e.is_busy()`.
//!     Ok(voucher_id * 1000 + user_id)
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), AppError> {
//! // Once at start-up: the process-wide client the attribute uses by default.
//! let client = LockClient::open("redis://127.0.0.1:6379/").await?;
//! lock_core::install_global(client).expect("installed once");
//! place_order(7, 42).await?;
//! # Ok(()) }
//! ```
//!
//! Add both crates: `lock-core` (the engine, which the generated code calls) and
//! `lock-macros`.
//!
//! # Arguments
//!
//! | argument | meaning | default |
//! | --- | --- | --- |
//! | `prefix = "order"` | first part of the lock key (required, not empty) | |
//! | `key = arg`, `key = order.user_id`, `key = (a, b.c)` | arguments, bindings or field paths into them, each a key part | no parts: one lock per fn |
//! | `expire = "10s"` | fixed lease: `"500ms"`, `"10s"`, `"2m"`, `"1h"` or an integer of seconds | the watchdog renews while the body runs |
//! | `wait = "2s"` | how long to wait for a busy lock | `0`: reject a concurrent duplicate at once |
//! | `release = "on_expiry"` | keep the lock until `expire` passes (an anti-resubmit window) | `"on_return"`: release when the body ends |
//! | `delimiter = "-"` | joins prefix and key parts (escaped inside parts) | the client's configured delimiter (`":"` unless changed) |
//! | `hold = "fair"` | a fair lock: callers that wait get it in the order they asked (see lock-core's `LockOptions::fair`) | `"exclusive"`: a plain lock |
//! | `hold = "read"`, `hold = "write"` | a read or the write hold of the name's read-write lock (many readers or one writer; see lock-core's `LockOptions::read`) | `"exclusive"`: a plain lock |
//! | `client = app.locks` | an expression giving any lock store (`LockClient`, `Redlock`, `MemoryLocks`, `AnyLocks`, a database or ZooKeeper store, or a reference or smart pointer to one) | the store installed with `lock_core::install_global` (any store) |
//!
//! One example per argument (each compiles; running needs a Redis):
//!
//! ```no_run
//! # use lock_core::{LockClient, LockError};
//! # use lock_macros::cache_lock;
//! # struct User { id: u64 }
//! // prefix: the only required argument. Without `key`, one lock for every call.
//! #[cache_lock(prefix = "nightly-report")]
//! async fn report() -> Result<(), LockError> { Ok(()) }
//!
//! // key: an argument, a field path, or a tuple of them.
//! #[cache_lock(prefix = "cart", key = (shop, user.id))]
//! async fn checkout(shop: u32, user: &User) -> Result<(), LockError> { Ok(()) }
//!
//! // expire: a fixed lease ("500ms", "10s", "2m", "1h", or seconds as an integer).
//! #[cache_lock(prefix = "export", key = id, expire = 30)]
//! async fn export(id: u64) -> Result<(), LockError> { Ok(()) }
//!
//! // wait: queue behind the current holder for up to 2 s instead of failing at once.
//! #[cache_lock(prefix = "ledger", key = account, wait = "2s")]
//! async fn post_entry(account: u64) -> Result<(), LockError> { Ok(()) }
//!
//! // release = "on_expiry": keep the lock for the whole lease (reject resubmits).
//! #[cache_lock(prefix = "sms", key = phone, expire = "60s", release = "on_expiry")]
//! async fn send_code(phone: String) -> Result<(), LockError> { Ok(()) }
//!
//! // delimiter: the lock is named "pay|<order>" instead of "pay:<order>".
//! #[cache_lock(prefix = "pay", key = order, delimiter = "|")]
//! async fn pay(order: u64) -> Result<(), LockError> { Ok(()) }
//!
//! // client: any expression giving a &LockClient (here from an argument).
//! #[cache_lock(prefix = "sync", key = id, client = locks)]
//! async fn sync(locks: &LockClient, id: u64) -> Result<(), LockError> { Ok(()) }
//! ```
//!
//! With axum, take the client from the state and the key from the path, and answer
//! with lock-tower's `Problem` (`From<LockError>`: a busy lock is 409 problem+json with
//! `Retry-After`, Redis down 503):
//!
//! ```no_run
//! use axum::extract::{Path, State};
//! use lock_core::LockClient;
//! use lock_macros::cache_lock;
//! use lock_tower::problem::Problem;
//!
//! #[derive(Clone)]
//! struct App {
//!     locks: LockClient,
//! }
//!
//! #[cache_lock(prefix = "order", key = user_id, client = app.locks)]
//! async fn create_order(
//!     State(app): State<App>,
//!     Path(user_id): Path<u64>,
//! ) -> Result<String, Problem> {
//!     Ok(format!("order for {user_id}"))
//! }
//!
//! # fn router(app: App) -> axum::Router {
//! axum::Router::new()
//!     .route("/users/{user_id}/orders", axum::routing::post(create_order))
//!     .with_state(app)
//! # }
//! ```
//!
//! The key is `prefix`, then each key part, joined by the delimiter; lock-core escapes
//! every part, so user input cannot forge another lock's key. A key part's type must
//! implement `lock_core::KeyPart` (integers, strings, `bool`, `char`, IP addresses ...).
//!
//! # Behaviour
//!
//! - The fn's signature, visibility, attributes, generics and receiver are unchanged.
//! - The return type must be `Result<_, E>` with `E: From<lock_core::LockError>`; a lock
//!   that is busy (or a wait that timed out, or Redis down) is returned as `Err(e.into())`
//!   before the body runs.
//! - Nested annotated calls that resolve to the same key in the same task re-enter
//!   instead of deadlocking (the outermost call opens a `lock_core::LockScope`); other
//!   tasks and processes exclude each other.
//! - The lock is released on every exit: `Ok`, `Err`, `?`, `return`, a panic in the
//!   body, and the caller dropping the future.
//!
//! ```no_run
//! # use lock_core::LockError;
//! # use lock_macros::cache_lock;
//! struct Inventory {
//!     locks: lock_core::LockClient,
//!     shard: u32,
//! }
//!
//! struct Order {
//!     user_id: u64,
//!     sku: String,
//! }
//!
//! impl Inventory {
//!     // A field path and a tuple; the client comes from `self`; wait up to 2 s.
//!     #[cache_lock(prefix = "stock", key = (self.shard, order.sku), wait = "2s", client = self.locks)]
//!     async fn reserve(&self, order: &Order) -> Result<(), LockError> {
//!         let _ = order.user_id;
//!         Ok(())
//!     }
//! }
//!
//! // An anti-resubmit window: a second submission within 5 s is rejected.
//! #[cache_lock(prefix = "submit", key = form_id, expire = "5s", release = "on_expiry")]
//! async fn submit(form_id: String) -> Result<(), LockError> {
//!     Ok(())
//! }
//! ```

// Lints: `[workspace.lints]` in the workspace Cargo.toml.

// The README's examples compile as doctests, so the README stays true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

mod attr;
mod expand;

use proc_macro::TokenStream;

/// Takes a Redis lock named from `prefix` and `key` before the body of an async fn runs,
/// and gives it back when the body ends. See the [crate docs](crate) for the arguments.
#[proc_macro_attribute]
pub fn cache_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let args = match syn::parse::<attr::Args>(args) {
        Ok(a) => a,
        Err(e) => return with_item(e, item),
    };
    let func = match syn::parse::<syn::ItemFn>(item.clone()) {
        Ok(f) => f,
        // Not a fn, or a body that does not parse: re-emit it untouched so rustc reports
        // the real problem, plus our note.
        Err(e) => return with_item(e, item),
    };
    match expand::expand(args, func) {
        Ok(tokens) => tokens.into(),
        Err(e) => with_item(e, item),
    }
}

/// The error, and the item as written, so the rest of the crate still type-checks.
fn with_item(e: syn::Error, item: TokenStream) -> TokenStream {
    let mut out: TokenStream = e.into_compile_error().into();
    out.extend(item);
    out
}
