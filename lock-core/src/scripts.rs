//! Every Lua script of the crate, loaded from the workspace's `lua/` folder.
//!
//! Each runs through [`redis::Script`]: EVALSHA first, and on a NOSCRIPT reply (after a
//! server restart or `SCRIPT FLUSH`) the script is loaded and the call repeated.
//!
//! Every script starts with the Redis 7 shebang `#!lua` (no flags): Redis runs such
//! scripts about a fifth faster than flag-less legacy scripts, refuses them when it is
//! out of memory (right for scripts that write), and requires them to name every key in
//! KEYS. This is why Redis 7.0 or newer is required.

use std::sync::LazyLock;

use redis::Script;

/// Take or re-enter a lock. See `lua/acquire.lua`.
pub(crate) static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/acquire.lua")));
/// Give back one or all holds. See `lua/release.lua`.
pub(crate) static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/release.lua")));
/// Renew one or many leases. See `lua/renew.lua`.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/renew.lua")));
/// Write guarded by a fencing token. See `lua/fenced_write.lua`.
pub(crate) static FENCED_WRITE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/fenced_write.lua")));

/// One GCRA rate-limit decision. See `lua/gcra.lua`.
pub(crate) static GCRA: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/gcra.lua")));
/// The seed's fixed-window rule with lockout. See `lua/limit_rule.lua`.
pub(crate) static LIMIT_RULE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/limit_rule.lua")));
/// Take permits of an expiring semaphore. See `lua/semaphore_acquire.lua`.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/semaphore_acquire.lua")));
/// Give back semaphore permits by id. See `lua/semaphore_release.lua`.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/semaphore_release.lua")));
/// Set a new lease on semaphore permits. See `lua/semaphore_extend.lua`.
pub(crate) static SEMAPHORE_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/semaphore_extend.lua")));
/// The next sequence number of a day's order-id counter. See `lua/next_id.lua`.
pub(crate) static NEXT_ID: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/next_id.lua")));
/// Reserve a block of a day's order-id counter. See `lua/reserve_ids.lua`.
pub(crate) static RESERVE_IDS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/reserve_ids.lua")));

/// Store the response of a claimed key. See `lua/idempotency_complete.lua`.
pub(crate) static IDEMPOTENCY_COMPLETE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/idempotency_complete.lua")));
/// Free a claimed key. See `lua/idempotency_abandon.lua`.
pub(crate) static IDEMPOTENCY_ABANDON: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/idempotency_abandon.lua")));
/// Renew the in-flight lease of a claimed key. See `lua/idempotency_extend.lua`.
pub(crate) static IDEMPOTENCY_EXTEND: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/idempotency_extend.lua")));

/// Source of every script, by file name, for tooling and tests.
pub const SOURCES: &[(&str, &str)] = &[
    ("acquire.lua", include_str!("../lua/acquire.lua")),
    ("release.lua", include_str!("../lua/release.lua")),
    ("renew.lua", include_str!("../lua/renew.lua")),
    ("fenced_write.lua", include_str!("../lua/fenced_write.lua")),
    ("gcra.lua", include_str!("../lua/gcra.lua")),
    ("limit_rule.lua", include_str!("../lua/limit_rule.lua")),
    (
        "semaphore_acquire.lua",
        include_str!("../lua/semaphore_acquire.lua"),
    ),
    (
        "semaphore_release.lua",
        include_str!("../lua/semaphore_release.lua"),
    ),
    (
        "semaphore_extend.lua",
        include_str!("../lua/semaphore_extend.lua"),
    ),
    ("next_id.lua", include_str!("../lua/next_id.lua")),
    ("reserve_ids.lua", include_str!("../lua/reserve_ids.lua")),
    (
        "idempotency_complete.lua",
        include_str!("../lua/idempotency_complete.lua"),
    ),
    (
        "idempotency_abandon.lua",
        include_str!("../lua/idempotency_abandon.lua"),
    ),
    (
        "idempotency_extend.lua",
        include_str!("../lua/idempotency_extend.lua"),
    ),
];

#[cfg(test)]
mod tests {
    #[test]
    fn every_script_documents_keys_argv_and_returns() {
        for (name, src) in super::SOURCES {
            assert!(
                src.starts_with("#!lua\n"),
                "{name}: Redis 7 script shebang missing"
            );
            let header: String = src
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("--"))
                .collect();
            for word in ["KEYS[", "ARGV[", "Returns"] {
                assert!(header.contains(word), "{name} header lacks {word}");
            }
        }
    }
}
