//! Whose key it is (the principal), the stored key's scope, and the request fingerprint.

use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{Method, Request, request};
use lock_core::key::{LockName, NameWriter};
use sha2::{Digest, Sha256};

use crate::hash::{hex, sha256_hex};

/// Who sent a request, so that one client can never read another's stored response:
/// the stored key is scoped by method, path, principal and the client's key.
///
/// `None` (or an empty string) means anonymous: the layer refuses such a keyed request
/// with 400 unless [`allow_anonymous`](super::IdempotencyLayer::allow_anonymous) is set,
/// in which case all anonymous clients share one scope per method and path, and only
/// the secrecy of their keys separates them.
///
/// Implemented by [`AuthorizationHash`] (the default) and for closures
/// `Fn(&Request<B>) -> Option<String>`, e.g. a tenant header a gateway sets:
///
/// ```
/// use http::Request;
/// use lock_tower::idempotency::Principal;
///
/// let tenant = |r: &Request<()>| Some(r.headers().get("x-tenant")?.to_str().ok()?.to_owned());
/// let r = Request::post("/").header("x-tenant", "acme").body(()).unwrap();
/// assert_eq!(tenant.principal(&r).as_deref(), Some("acme"));
/// ```
pub trait Principal<B> {
    /// The principal of `request`.
    fn principal(&self, request: &Request<B>) -> Option<String>;
}

impl<B, F> Principal<B> for F
where
    F: Fn(&Request<B>) -> Option<String>,
{
    fn principal(&self, request: &Request<B>) -> Option<String> {
        self(request)
    }
}

/// The principal is the SHA-256 (hex) of the `Authorization` header(s), when present:
/// two credentials never share stored responses, and no credential is stored in Redis.
///
/// A client whose credential changes between a request and its retry (a refreshed
/// bearer token) lands in a new scope, so the retry runs again: derive the principal
/// from a stable user id with a closure when that matters.
#[derive(Debug, Clone, Copy, Default)]
pub struct AuthorizationHash;

impl<B> Principal<B> for AuthorizationHash {
    fn principal(&self, request: &Request<B>) -> Option<String> {
        let mut values = request.headers().get_all(AUTHORIZATION).iter().peekable();
        values.peek()?;
        let mut h = Sha256::new();
        for v in values {
            update_field(&mut h, v.as_bytes());
        }
        Some(hex(&h.finalize()))
    }
}

/// Paths longer than this are hashed into the key (a key name is at most 1024 bytes).
const MAX_PATH_IN_KEY: usize = 256;

/// The parts of the stored key: method, path, principal, then the client's key (when
/// those are too long to store once escaped, [`Scope::hashed`]).
#[derive(Debug)]
pub(crate) struct Scope {
    method: Method,
    path: String,
    principal: Option<String>,
    key: String,
}

/// A [`Scope`] stored as the SHA-256 of its parts.
#[derive(Debug)]
pub(crate) struct HashedScope(String);

impl Scope {
    pub(crate) fn new(method: &Method, path: &str, principal: Option<String>, key: String) -> Self {
        // Request paths start with '/', so a hashed one cannot equal a literal one.
        let path = if path.len() > MAX_PATH_IN_KEY {
            format!("sha256:{}", sha256_hex(path.as_bytes()))
        } else {
            path.to_owned()
        };
        Self {
            method: method.clone(),
            path,
            principal: principal.filter(|p| !p.is_empty()),
            key,
        }
    }

    /// The same scope as one digest of its parts, each length-prefixed: for parts whose
    /// escaped name is longer than a key may be. Every request with these parts takes
    /// this form alike, and its two parts cannot spell a literal scope (of four or five).
    pub(crate) fn hashed(&self) -> HashedScope {
        let mut h = Sha256::new();
        let principal = self.principal.as_deref().map(str::as_bytes);
        for field in [
            self.method.as_str().as_bytes(),
            self.path.as_bytes(),
            principal.map_or(&b"anonymous"[..], |_| b"principal"),
            principal.unwrap_or_default(),
            self.key.as_bytes(),
        ] {
            update_field(&mut h, field);
        }
        HashedScope(hex(&h.finalize()))
    }
}

impl LockName for &Scope {
    fn write_parts(&self, w: &mut NameWriter) {
        w.part(self.method.as_str());
        w.part(&self.path);
        // Anonymous and identified scopes differ in their number of parts.
        match &self.principal {
            None => w.part("anonymous"),
            Some(p) => {
                w.part("principal");
                w.part(p);
            }
        }
        w.part(&self.key);
    }
}

impl LockName for HashedScope {
    fn write_parts(&self, w: &mut NameWriter) {
        w.part("sha256");
        w.part(&self.0);
    }
}

/// SHA-256 over method, path and query, content type and body, each length-prefixed so
/// no two different requests hash the same fields.
pub(crate) fn fingerprint(parts: &request::Parts, body: &[u8]) -> String {
    let mut h = Sha256::new();
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .map_or(&b""[..], |v| v.as_bytes());
    for field in [
        parts.method.as_str().as_bytes(),
        target.as_bytes(),
        content_type,
        body,
    ] {
        update_field(&mut h, field);
    }
    hex(&h.finalize())
}

fn update_field(h: &mut Sha256, field: &[u8]) {
    h.update((field.len() as u64).to_be_bytes());
    h.update(field);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str, content_type: Option<&str>) -> request::Parts {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            b = b.header(CONTENT_TYPE, ct);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn fingerprint_covers_method_target_type_and_body() {
        let base = fingerprint(&parts("POST", "/a?x=1", Some("text/plain")), b"hi");
        assert_eq!(base.len(), 64);
        assert_eq!(
            base,
            fingerprint(&parts("POST", "/a?x=1", Some("text/plain")), b"hi")
        );
        for other in [
            fingerprint(&parts("PATCH", "/a?x=1", Some("text/plain")), b"hi"),
            fingerprint(&parts("POST", "/a?x=2", Some("text/plain")), b"hi"),
            fingerprint(&parts("POST", "/a?x=1", None), b"hi"),
            fingerprint(&parts("POST", "/a?x=1", Some("text/plain")), b"hi!"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn principals_and_scopes() {
        let r = |auth: Option<&str>| {
            let mut b = Request::post("/");
            if let Some(a) = auth {
                b = b.header(AUTHORIZATION, a);
            }
            b.body(()).unwrap()
        };
        assert_eq!(AuthorizationHash.principal(&r(None)), None);
        let alice = AuthorizationHash.principal(&r(Some("Bearer alice")));
        let bob = AuthorizationHash.principal(&r(Some("Bearer bob")));
        assert!(alice.is_some() && alice != bob);
        assert!(
            !alice.unwrap().contains("alice"),
            "credentials must not be stored"
        );

        fn name(s: impl LockName) -> String {
            lock_core::key::lock_keys("ns", ":", &s)
                .unwrap()
                .name()
                .to_owned()
        }
        let post = Method::POST;
        let anon = name(&Scope::new(&post, "/pay", None, "k".into()));
        let named = name(&Scope::new(
            &post,
            "/pay",
            Some("anonymous".into()),
            "k".into(),
        ));
        assert_ne!(anon, named);
        assert_eq!(
            anon,
            name(&Scope::new(&post, "/pay", Some(String::new()), "k".into()))
        );
        let long = "/x".repeat(200);
        let hashed = name(&Scope::new(&post, &long, None, "k".into()));
        assert!(hashed.contains("sha256"), "{hashed}");

        // Hashed whole: one name per scope, each of them different.
        let whole = |principal: Option<&str>, key: &str| {
            name(Scope::new(&post, "/pay", principal.map(str::to_owned), key.into()).hashed())
        };
        assert_eq!(whole(None, "k"), whole(None, "k"));
        let all = [
            whole(None, "k"),
            whole(Some("anonymous"), "k"),
            whole(Some("p"), "k"),
            whole(Some("p"), "k2"),
            whole(Some("pk"), ""),
        ];
        for (i, a) in all.iter().enumerate() {
            assert!(all[i + 1..].iter().all(|b| b != a), "{a} repeats");
            assert_ne!(a, &anon);
        }
    }
}
