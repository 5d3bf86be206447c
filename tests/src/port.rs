//! Picking TCP ports for test servers.

use std::collections::HashSet;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

/// Lowest port handed out from outside the ephemeral range.
const LOWEST: u16 = 15_000;

/// Returns a TCP port on `127.0.0.1` that nothing was listening on a moment ago.
///
/// Ports come from *outside* the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`) whenever possible: outgoing
/// connections take their local port from that range, so a port inside it can
/// be grabbed by some client socket while a killed server is down (a client
/// reconnecting to a dead port on loopback can even connect to itself). Ports
/// already returned by this process are not returned again while others are
/// available.
///
/// The port is free only at the time of the check; [`crate::RedisServer`]
/// retries with another port if it loses that race.
pub fn free_port() -> u16 {
    let (low, high) = ephemeral_range();
    let (from, to) = if low > LOWEST + 1_000 {
        (LOWEST, low - 1)
    } else if high < u16::MAX - 1_000 {
        (high + 1, u16::MAX)
    } else {
        (0, 0)
    };
    if to > from {
        let span = u64::from(to - from) + 1;
        let mut given = given().lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..200 {
            // `span` fits in u16 arithmetic, so the cast cannot truncate.
            let port = from + (random() % span) as u16;
            if !given.contains(&port) && bindable(port) {
                given.insert(port);
                return port;
            }
        }
    }
    // Fall back to whatever the kernel picks.
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("cannot bind any TCP port on 127.0.0.1")
}

/// Whether a listener could bind `127.0.0.1:port` right now.
pub(crate) fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

fn given() -> &'static Mutex<HashSet<u16>> {
    static GIVEN: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    GIVEN.get_or_init(Default::default)
}

fn ephemeral_range() -> (u16, u16) {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| {
            let mut parts = text.split_whitespace().map(|p| p.parse::<u16>().ok());
            Some((parts.next()??, parts.next()??))
        })
        .unwrap_or((32_768, 60_999))
}

/// A random number: std's `RandomState` is seeded randomly per instance.
fn random() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}
