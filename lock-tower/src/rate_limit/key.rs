//! Who a request counts against: the client's address, a header, or the client behind
//! trusted proxies.

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use http::{HeaderName, Request};
use lock_core::key::{LockName, NameWriter};

use crate::KeyExtractor;
use crate::hash::sha256_hex;

/// Keys longer than this many bytes are counted under their SHA-256 instead: a key
/// the limiter's Redis key could not hold must never switch the limit off.
pub const MAX_LITERAL_KEY_LEN: usize = 128;

/// The key as the limiter counts it: literal when short, hashed when long. The two
/// forms have a different number of name parts, so they never collide.
#[derive(Debug)]
pub(crate) enum LimitKey {
    Literal(String),
    Hashed(String),
}

impl LimitKey {
    /// `None` for an empty key (nobody to count against).
    pub(crate) fn new(key: String) -> Option<Self> {
        if key.is_empty() {
            None
        } else if key.len() > MAX_LITERAL_KEY_LEN {
            Some(Self::Hashed(sha256_hex(key.as_bytes())))
        } else {
            Some(Self::Literal(key))
        }
    }
}

impl LockName for LimitKey {
    fn write_parts(&self, w: &mut NameWriter) {
        match self {
            Self::Literal(key) => w.part(key),
            Self::Hashed(digest) => {
                w.part("sha256");
                w.part(digest);
            }
        }
    }
}

/// The peer's address, as the server saw the connection.
///
/// Read from the request extensions: axum's `ConnectInfo<SocketAddr>` (serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`; needs this crate's `axum`
/// feature), or a plain `SocketAddr` a hyper server inserted itself.
///
/// Behavior: an IPv4 peer (or an IPv4-mapped IPv6 one) is keyed by its address; an
/// IPv6 peer by its network, the first [`DEFAULT_IPV6_PREFIX`] (64) bits by default,
/// since one subscriber usually holds a whole /64 and could rotate addresses inside it.
///
/// ```
/// use lock_tower::rate_limit::PeerIp;
///
/// let per_64 = PeerIp::new();
/// let per_48 = PeerIp::new().ipv6_prefix(48);
/// # let _ = (per_64, per_48);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

/// How many leading bits of an IPv6 client address make its key, unless set otherwise.
pub const DEFAULT_IPV6_PREFIX: u8 = 64;

impl PeerIp {
    /// Keys by peer address, IPv6 by its /64.
    pub fn new() -> Self {
        Self {
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        }
    }

    /// Keys IPv6 peers by their first `bits` bits (128: each address on its own).
    /// Default 64; values over 128 count as 128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }
}

impl Default for PeerIp {
    /// [`PeerIp::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// The key of a client address: IPv4 as is, IPv6 as its network `addr/prefix`.
fn client_key(ip: IpAddr, ipv6_prefix: u8) -> String {
    match ip.to_canonical() {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let net = Ipv6Addr::from(u128::from(v6) & v6_mask(ipv6_prefix));
            format!("{net}/{ipv6_prefix}")
        }
    }
}

fn v6_mask(prefix: u8) -> u128 {
    u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0)
}

pub(crate) fn peer_ip<B>(request: &Request<B>) -> Option<IpAddr> {
    let ext = request.extensions();
    #[cfg(feature = "axum")]
    if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    ext.get::<SocketAddr>().map(SocketAddr::ip)
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
        Ok(peer_ip(request).map(|ip| client_key(ip, self.ipv6_prefix)))
    }
}

/// The value of a request header (e.g. an API key or `X-User-Id`), trimmed, as is.
///
/// Behavior: a value that is missing, empty or not visible ASCII is no key (the rate
/// limit answers 400).
#[derive(Debug, Clone)]
pub struct HeaderKey(pub HeaderName);

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
        let value = request.headers().get(&self.0);
        let v = value.and_then(|v| v.to_str().ok()).map(str::trim);
        Ok(v.filter(|v| !v.is_empty()).map(str::to_owned))
    }
}

/// An IP network (`10.0.0.0/8`, `::1/128`, or a bare address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parses `addr/prefix` or a bare address.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a.parse().ok()?, p.parse().ok()?),
            None => {
                let a: IpAddr = s.parse().ok()?;
                (a, if a.is_ipv4() { 32 } else { 128 })
            }
        };
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return None;
        }
        // A peer's IPv4-mapped address counts as IPv4 (`contains`), so a mapped network
        // is the IPv4 network it maps.
        if let IpAddr::V6(v6) = addr
            && prefix >= 96
            && let Some(v4) = v6.to_ipv4_mapped()
        {
            return Some(Self {
                addr: IpAddr::V4(v4),
                prefix: prefix - 96,
            });
        }
        Some(Self { addr, prefix })
    }

    /// Whether `ip` is inside this network.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = v6_mask(self.prefix);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The client address behind trusted reverse proxies.
///
/// Behavior: starting from the connection's peer, while that address is a trusted
/// proxy, step one hop left in `X-Forwarded-For`; the first untrusted address is the
/// client. A request whose peer is not a trusted proxy is keyed by the peer itself, so
/// a client cannot choose its key by sending the header. Without a peer address, the
/// request cannot be identified. An IPv6 client is keyed by its /64, as with
/// [`PeerIp`] ([`ForwardedFor::ipv6_prefix`]).
#[derive(Debug, Clone)]
pub struct ForwardedFor {
    trusted: Vec<IpNet>,
    ipv6_prefix: u8,
}

impl ForwardedFor {
    /// Trusts the given proxies (`"10.0.0.0/8"`, `"127.0.0.1"`, ...); entries that do
    /// not parse are an error naming them.
    pub fn trusting<I, S>(proxies: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut trusted = Vec::new();
        for p in proxies {
            let p = p.as_ref();
            trusted.push(IpNet::parse(p).ok_or_else(|| format!("not an IP network: {p:?}"))?);
        }
        Ok(Self {
            trusted,
            ipv6_prefix: DEFAULT_IPV6_PREFIX,
        })
    }

    /// Keys IPv6 clients by their first `bits` bits (128: each address on its own).
    /// Default 64; values over 128 count as 128.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The client address for a peer and the `X-Forwarded-For` values, in order. A hop
    /// is an address, with or without a port (`203.0.113.9:4711`, `[2001:db8::7]:443`).
    pub fn client_ip<'a>(&self, peer: IpAddr, forwarded: impl Iterator<Item = &'a str>) -> IpAddr {
        self.client_behind(peer, forwarded.map(str::as_bytes))
    }

    /// [`client_ip`](Self::client_ip) over the header values' bytes: a value that is not
    /// text garbles only the hops it is not, not the ones proxies appended to it.
    fn client_behind<'a>(&self, peer: IpAddr, values: impl Iterator<Item = &'a [u8]>) -> IpAddr {
        let hops: Vec<&[u8]> = values.flat_map(|v| v.split(|b| *b == b',')).collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            if !self.is_trusted(client) {
                break;
            }
            match hop_ip(hop) {
                Some(ip) => client = ip,
                // A garbled hop: the proxy that added it is the last thing we can trust.
                None => break,
            }
        }
        client
    }
}

/// The address of one `X-Forwarded-For` hop: `ip`, `ip:port`, `[ipv6]` or
/// `[ipv6]:port`.
fn hop_ip(hop: &[u8]) -> Option<IpAddr> {
    let hop = std::str::from_utf8(hop).ok()?.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(addr) = hop.parse::<SocketAddr>() {
        return Some(addr.ip());
    }
    hop.strip_prefix('[')?
        .strip_suffix(']')?
        .parse::<IpAddr>()
        .ok()
}

impl<B> KeyExtractor<B> for ForwardedFor {
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
        let Some(peer) = peer_ip(request) else {
            return Ok(None);
        };
        let values = request
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes());
        Ok(Some(client_key(
            self.client_behind(peer, values),
            self.ipv6_prefix,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn networks() {
        let n = IpNet::parse("10.0.0.0/8").unwrap();
        assert!(n.contains(ip("10.1.2.3")) && !n.contains(ip("11.0.0.1")));
        assert!(IpNet::parse("::1").unwrap().contains(ip("::1")));
        assert!(IpNet::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(IpNet::parse("10.0.0.0/33").is_none());
        assert!(IpNet::parse("nope").is_none());
    }

    /// An IPv4-mapped network is the IPv4 network it maps, as a peer's mapped address
    /// is its IPv4 address.
    #[test]
    fn mapped_networks_hold_their_ipv4_addresses() {
        let n = IpNet::parse("::ffff:10.0.0.0/104").unwrap();
        for peer in ["::ffff:10.0.0.5", "10.9.8.7"] {
            assert!(n.contains(ip(peer)), "{peer}");
        }
        assert!(!n.contains(ip("11.0.0.1")));
        assert!(
            IpNet::parse("::ffff:10.0.0.5")
                .unwrap()
                .contains(ip("10.0.0.5"))
        );
        // Wider than the mapped range: an IPv6 network, which holds no IPv4 peer.
        assert!(
            !IpNet::parse("::ffff:0:0/95")
                .unwrap()
                .contains(ip("10.0.0.5"))
        );
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_network() {
        assert_eq!(
            client_key(ip("2001:db8:1:2:aa::9"), 64),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            client_key(ip("2001:db8:1:2:aa::9"), 128),
            "2001:db8:1:2:aa::9/128"
        );
        assert_eq!(client_key(ip("2001:db8:1:2:aa::9"), 0), "::/0");
        assert_eq!(client_key(ip("::ffff:198.51.100.7"), 64), "198.51.100.7");
        assert_eq!(client_key(ip("198.51.100.7"), 64), "198.51.100.7");
    }

    #[test]
    fn forwarded_for_trusts_only_configured_proxies() {
        let f = ForwardedFor::trusting(["10.0.0.0/8"]).unwrap();
        let xff = |s: &'static str| std::iter::once(s);
        // Through one trusted proxy: the client is the hop it added.
        assert_eq!(
            f.client_ip(ip("10.0.0.5"), xff("203.0.113.9")),
            ip("203.0.113.9")
        );
        // A spoofed header from an untrusted peer is ignored.
        assert_eq!(
            f.client_ip(ip("198.51.100.7"), xff("1.2.3.4")),
            ip("198.51.100.7")
        );
        // The client prepended a fake hop: only the hops added by trusted proxies count.
        assert_eq!(
            f.client_ip(ip("10.0.0.5"), xff("6.6.6.6, 203.0.113.9, 10.0.0.9")),
            ip("203.0.113.9")
        );
        assert_eq!(f.client_ip(ip("10.0.0.5"), xff("garbage")), ip("10.0.0.5"));
        assert!(ForwardedFor::trusting(["10.0.0.0/40"]).is_err());
    }

    /// Hops some proxies write with the client's port, bracketed or not.
    #[test]
    fn forwarded_hops_with_a_port_name_their_address() {
        let f = ForwardedFor::trusting(["10.0.0.0/8"]).unwrap();
        let xff = |s: &'static str| std::iter::once(s);
        for (hop, client) in [
            ("203.0.113.9:4711", "203.0.113.9"),
            ("[2001:db8::7]:443", "2001:db8::7"),
            ("[2001:db8::7]", "2001:db8::7"),
            ("2001:db8::7", "2001:db8::7"),
        ] {
            assert_eq!(f.client_ip(ip("10.0.0.5"), xff(hop)), ip(client), "{hop}");
        }
    }

    /// A proxy appends the client's address to the line the client sent: bytes the
    /// client put before it (not even text) do not hide it.
    #[test]
    fn a_garbled_hop_sent_by_the_client_hides_only_itself() {
        let f = ForwardedFor::trusting(["10.0.0.0/8"]).unwrap();
        let request = |value: &[u8]| {
            let mut r = Request::new(());
            r.extensions_mut()
                .insert(SocketAddr::from(([10, 0, 0, 5], 40000)));
            r.headers_mut().insert(
                "x-forwarded-for",
                http::HeaderValue::from_bytes(value).unwrap(),
            );
            r
        };
        let key = |value: &[u8]| f.extract(&request(value)).unwrap();
        assert_eq!(
            key(b"\x80\xff, 203.0.113.9"),
            Some("203.0.113.9".to_owned())
        );
        // Garbled where the trusted proxy's own hop should be: the proxy is the client.
        assert_eq!(key(b"203.0.113.9, \x80"), Some("10.0.0.5".to_owned()));
    }
}
