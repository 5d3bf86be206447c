//! Who a request counts against: pluggable key extractors.

use std::net::{IpAddr, SocketAddr};

use http::{HeaderName, Request};
use lock_core::key::{LockName, NameWriter};

use crate::hash::sha256_hex;

/// Keys longer than this many bytes are counted under their SHA-256 instead: a key
/// the limiter's Redis key could not hold must never switch the limit off.
pub const MAX_LITERAL_KEY_LEN: usize = 128;

/// Derives the rate-limit key of a request (`None` or an empty key: the client cannot
/// be identified, and the request is rejected with 400).
///
/// Any key is accepted: one longer than [`MAX_LITERAL_KEY_LEN`] bytes is counted under
/// its SHA-256, so no key switches the limit off. Two spellings of one client (`7` and
/// `007`) are two keys: normalize in the extractor (a closure parsing the id) when the
/// application treats them as one.
///
/// Implemented for closures `Fn(&Request<B>) -> Option<String>`, and by [`PeerIp`],
/// [`HeaderKey`] and [`ForwardedFor`].
pub trait KeyExtractor<B> {
    /// The key of `request`.
    fn extract(&self, request: &Request<B>) -> Option<String>;
}

impl<B, F> KeyExtractor<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn extract(&self, request: &Request<B>) -> Option<String> {
        self(request)
    }
}

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
#[derive(Debug, Clone, Copy, Default)]
pub struct PeerIp;

pub(crate) fn peer_ip<B>(request: &Request<B>) -> Option<IpAddr> {
    let ext = request.extensions();
    #[cfg(feature = "axum")]
    if let Some(info) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    ext.get::<SocketAddr>().map(SocketAddr::ip)
}

impl<B> KeyExtractor<B> for PeerIp {
    fn extract(&self, request: &Request<B>) -> Option<String> {
        peer_ip(request).map(|ip| ip.to_string())
    }
}

/// The value of a request header (e.g. an API key or `X-User-Id`).
#[derive(Debug, Clone)]
pub struct HeaderKey(pub HeaderName);

impl<B> KeyExtractor<B> for HeaderKey {
    fn extract(&self, request: &Request<B>) -> Option<String> {
        let v = request.headers().get(&self.0)?.to_str().ok()?.trim();
        (!v.is_empty()).then(|| v.to_string())
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
        (prefix <= max).then_some(Self { addr, prefix })
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
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
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
/// request cannot be identified.
#[derive(Debug, Clone)]
pub struct ForwardedFor {
    trusted: Vec<IpNet>,
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
        Ok(Self { trusted })
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    /// The client address for a peer and the `X-Forwarded-For` values, in order.
    pub fn client_ip<'a>(&self, peer: IpAddr, forwarded: impl Iterator<Item = &'a str>) -> IpAddr {
        let hops: Vec<&str> = forwarded
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            if !self.is_trusted(client) {
                break;
            }
            match hop.parse::<IpAddr>() {
                Ok(ip) => client = ip,
                // A garbled hop: the proxy that added it is the last thing we can trust.
                Err(_) => break,
            }
        }
        client
    }
}

impl<B> KeyExtractor<B> for ForwardedFor {
    fn extract(&self, request: &Request<B>) -> Option<String> {
        let peer = peer_ip(request)?;
        let values = request
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok());
        Some(self.client_ip(peer, values).to_string())
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
}
