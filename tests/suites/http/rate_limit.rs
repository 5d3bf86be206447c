//! RateLimitLayer in an axum app on real Redis: 429 with headers, trusted proxies, and
//! failing open or closed when Redis is gone.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use http::{HeaderName, Request, StatusCode};
use lock_core::{LockClient, LockConfig, RateLimit};
use lock_tests::RedisServer;
use lock_tower::KeyExtractor;
use lock_tower::idempotency::IdempotencyLayer;
use lock_tower::rate_limit::{ForwardedFor, HeaderKey, PeerIp, RateLimitLayer};
use tower::ServiceExt;

async fn limiter_client(server: &RedisServer) -> LockClient {
    let config = LockConfig::new().with_command_timeout(Duration::from_millis(300));
    LockClient::open_with_config(server.url().as_str(), config)
        .await
        .unwrap()
}

fn app<K>(layer: RateLimitLayer<K>) -> Router
where
    K: lock_tower::rate_limit::KeyExtractor<Body> + Clone + Send + Sync + 'static,
{
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

fn get_as(user: &str) -> Request<Body> {
    Request::get("/")
        .header("x-user-id", user)
        .body(Body::empty())
        .unwrap()
}

fn header<'a>(r: &'a http::Response<Body>, name: &str) -> &'a str {
    r.headers().get(name).map_or("", |v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_limit_is_429_with_headers() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    let limiter = c.rate_limiter("per-user", RateLimit::per_minute(2));
    let router = app(RateLimitLayer::new(
        limiter,
        HeaderKey(HeaderName::from_static("x-user-id")),
    ));
    for remaining in [1, 0] {
        let r = router.clone().oneshot(get_as("alice")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "ratelimit-policy"), "\"default\";q=2;w=60");
        assert!(
            header(&r, "ratelimit").starts_with(&format!("\"default\";r={remaining};t=")),
            "{:?}",
            r.headers()
        );
    }
    let r = router.clone().oneshot(get_as("alice")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "content-type"), "application/problem+json");
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!((25..=30).contains(&retry), "Retry-After {retry}");
    assert!(header(&r, "ratelimit").starts_with("\"default\";r=0;t="));
    // Another user has their own quota; a request without the header cannot be keyed.
    assert_eq!(
        router
            .clone()
            .oneshot(get_as("bob"))
            .await
            .unwrap()
            .status(),
        200
    );
    let anonymous = Request::get("/").body(Body::empty()).unwrap();
    assert_eq!(router.oneshot(anonymous).await.unwrap().status(), 400);
}

fn all<'a>(r: &'a http::Response<Body>, name: &str) -> Vec<&'a str> {
    r.headers()
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap())
        .collect()
}

/// Two layers (per client, then per user) each add their own named limit: the inner
/// one's refusal shows its own state beside the outer one's, not the outer's instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_layers_each_report_their_own_limit() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    let per_user = RateLimitLayer::new(
        c.rate_limiter("per-user", RateLimit::per_minute(1)),
        HeaderKey(HeaderName::from_static("x-user-id")),
    )
    .policy_name("per-user")
    .unwrap();
    let per_client = RateLimitLayer::new(
        c.rate_limiter("per-client", RateLimit::per_second(100)),
        HeaderKey(HeaderName::from_static("x-user-id")),
    )
    .policy_name("per-client")
    .unwrap();
    let router = app(per_user).layer(per_client);
    let first = router.clone().oneshot(get_as("alice")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let r = router.oneshot(get_as("alice")).await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!(
        (50..=60).contains(&retry),
        "Retry-After {retry}: the per-user limit's"
    );
    let mut policies = all(&r, "ratelimit-policy");
    policies.sort_unstable();
    assert_eq!(
        policies,
        ["\"per-client\";q=100;w=1", "\"per-user\";q=1;w=60"]
    );
    let limits = all(&r, "ratelimit");
    assert_eq!(limits.len(), 2, "{limits:?}");
    assert!(
        limits.iter().any(|l| l.starts_with("\"per-user\";r=0;t=")),
        "{limits:?}"
    );
    assert!(
        limits
            .iter()
            .any(|l| l.starts_with("\"per-client\";r=98;t=")),
        "{limits:?}"
    );
    // A policy name is an HTTP structured-field string: printable ASCII, no quote.
    for bad in ["", "quo\"te", "back\\slash", "caf\u{e9}", "tab\t"] {
        let layer = RateLimitLayer::new(
            c.rate_limiter("x", RateLimit::per_second(1)),
            HeaderKey(HeaderName::from_static("x-user-id")),
        );
        let e = layer.policy_name(bad).unwrap_err();
        assert!(e.is_invalid_input(), "{bad:?}: {e}");
    }
}

fn from_peer(peer: &str, xff: Option<&str>) -> Request<Body> {
    let mut b = Request::get("/");
    if let Some(v) = xff {
        b = b.header("x-forwarded-for", v);
    }
    let mut r = b.body(Body::empty()).unwrap();
    let addr = SocketAddr::new(peer.parse().unwrap(), 40000);
    r.extensions_mut().insert(ConnectInfo(addr));
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    let limiter = c.rate_limiter("per-ip", RateLimit::per_minute(1));
    let proxies = ForwardedFor::trusting(["10.0.0.0/8"]).unwrap();
    let router = app(RateLimitLayer::new(limiter, proxies));

    // An untrusted client: its quota is its own address, whatever header it sends.
    let first = from_peer("198.51.100.7", Some("1.1.1.1"));
    assert_eq!(router.clone().oneshot(first).await.unwrap().status(), 200);
    for spoof in ["2.2.2.2", "3.3.3.3, 10.0.0.1"] {
        let r = router
            .clone()
            .oneshot(from_peer("198.51.100.7", Some(spoof)))
            .await
            .unwrap();
        assert_eq!(r.status(), 429, "spoofed {spoof} escaped the limit");
    }
    // Behind the trusted proxy, each client is keyed by the hop the proxy added.
    for client in ["203.0.113.9", "203.0.113.10"] {
        let r = router
            .clone()
            .oneshot(from_peer("10.0.0.5", Some(client)))
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{client}");
    }
    let again = from_peer("10.0.0.5", Some("203.0.113.9"));
    assert_eq!(router.oneshot(again).await.unwrap().status(), 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_open_by_default_or_closed_when_asked() {
    let mut server = RedisServer::start();
    let c = limiter_client(&server).await;
    let key = || HeaderKey(HeaderName::from_static("x-user-id"));
    let open = app(RateLimitLayer::new(
        c.rate_limiter("open", RateLimit::per_second(100)),
        key(),
    ));
    let closed = app(RateLimitLayer::new(
        c.rate_limiter("closed", RateLimit::per_second(100)),
        key(),
    )
    .fail_closed(true));
    assert_eq!(
        open.clone().oneshot(get_as("a")).await.unwrap().status(),
        200
    );
    assert_eq!(
        closed.clone().oneshot(get_as("a")).await.unwrap().status(),
        200
    );

    server.kill();
    let r = open.oneshot(get_as("a")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "fail open");
    assert!(
        r.headers().get("ratelimit").is_none(),
        "no decision, no headers"
    );
    let r = closed.oneshot(get_as("a")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "fail closed");
    assert_eq!(header(&r, "content-type"), "application/problem+json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closure_can_choose_the_key() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    // Key by tenant: the first path segment.
    let by_tenant = |r: &Request<Body>| r.uri().path().split('/').nth(1).map(str::to_owned);
    let router = Router::new()
        .route("/{tenant}/items", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(
            c.rate_limiter("tenant", RateLimit::per_minute(1)),
            by_tenant,
        ));
    let get_path = |p: &str| Request::get(p).body(Body::empty()).unwrap();
    assert_eq!(
        router
            .clone()
            .oneshot(get_path("/acme/items"))
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        router
            .clone()
            .oneshot(get_path("/acme/items"))
            .await
            .unwrap()
            .status(),
        429
    );
    assert_eq!(
        router
            .oneshot(get_path("/globex/items"))
            .await
            .unwrap()
            .status(),
        200
    );
}

/// A numeric id from a header: absent is no key, anything else malformed.
#[derive(Clone)]
struct NumericHeader(&'static str);

impl<B> KeyExtractor<B> for NumericHeader {
    fn extract(&self, request: &Request<B>) -> Result<Option<String>, String> {
        let Some(value) = request.headers().get(self.0) else {
            return Ok(None);
        };
        let text = value.to_str().unwrap_or_default();
        match text.parse::<u64>() {
            Ok(id) => Ok(Some(id.to_string())),
            Err(_) => Err(format!("{} {text:?} is not a number", self.0)),
        }
    }
}

/// One extractor type keys both layers, and one that refuses a key answers 400 with
/// its reason in either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_extractor_serves_both_layers_and_its_refusal_is_400() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    let router = Router::new()
        .route("/", post(|| async { "ok" }))
        .layer(
            IdempotencyLayer::new(c.idempotency_store("orders"))
                .key_extractor(NumericHeader("x-order-id"))
                .allow_anonymous(true),
        )
        .layer(RateLimitLayer::new(
            c.rate_limiter("per-user", RateLimit::per_minute(3)),
            NumericHeader("x-user-id"),
        ));
    let send = |headers: &[(&str, &str)]| {
        let mut b = Request::post("/");
        for (name, value) in headers {
            b = b.header(*name, *value);
        }
        router.clone().oneshot(b.body(Body::empty()).unwrap())
    };
    let text = |r: http::Response<Body>| async move {
        let bytes = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap();
        String::from_utf8(bytes.to_bytes().to_vec()).unwrap()
    };

    let r = send(&[("x-user-id", "alice")]).await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(header(&r, "content-type"), "application/problem+json");
    let body = text(r).await;
    assert!(body.contains("rate-limit-key-invalid"), "{body}");
    assert!(
        body.contains(r#"x-user-id \"alice\" is not a number"#),
        "{body}"
    );
    let r = send(&[]).await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(text(r).await.contains("rate-limit-key-missing"));

    let r = send(&[("x-user-id", "7"), ("x-order-id", "o-1")])
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body = text(r).await;
    assert!(body.contains("idempotency-key-invalid"), "{body}");
    assert!(
        body.contains(r#"x-order-id \"o-1\" is not a number"#),
        "{body}"
    );
    let first = send(&[("x-user-id", "7"), ("x-order-id", "1")])
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let again = send(&[("x-user-id", "07"), ("x-order-id", "01")])
        .await
        .unwrap();
    assert_eq!(
        (again.status(), header(&again, "idempotent-replayed")),
        (StatusCode::OK, "true"),
        "the extractor's normalized keys are the keys"
    );
}

/// No input switches the limit off: an over-long key is counted (hashed), an empty one
/// is 400, a broken quota 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_switches_the_limit_off() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    let user = || HeaderKey(HeaderName::from_static("x-user-id"));
    let router = app(RateLimitLayer::new(
        c.rate_limiter("per-user", RateLimit::per_minute(1)),
        user(),
    ));
    let padded = format!("{}7", "0".repeat(2000));
    assert_eq!(
        router
            .clone()
            .oneshot(get_as(&padded))
            .await
            .unwrap()
            .status(),
        200
    );
    let r = router.clone().oneshot(get_as(&padded)).await.unwrap();
    assert_eq!(r.status(), 429, "an over-long key escaped the limit");
    // Its hash is its own key: a short key is not caught by it, nor the reverse.
    assert_eq!(router.oneshot(get_as("7")).await.unwrap().status(), 200);

    let empty = app(RateLimitLayer::new(
        c.rate_limiter("empty", RateLimit::per_minute(1)),
        |_: &Request<Body>| Some(String::new()),
    ));
    let r = empty.oneshot(get_as("x")).await.unwrap();
    assert_eq!(r.status(), 400, "an empty key cannot be counted");

    let broken = app(RateLimitLayer::new(
        c.rate_limiter("broken", RateLimit::per_minute(0)),
        user(),
    ));
    let r = broken.oneshot(get_as("a")).await.unwrap();
    assert_eq!(r.status(), 500, "an invalid quota fails closed, never open");
    assert_eq!(header(&r, "content-type"), "application/problem+json");
}

/// An IPv6 client rotating addresses inside its /64 is one client (else each address
/// would get a fresh quota); the prefix is configurable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_peers_are_limited_per_64_by_default() {
    let server = RedisServer::start();
    let c = limiter_client(&server).await;
    let status = |router: &Router, peer: &str, xff: Option<&str>| {
        let r = router.clone().oneshot(from_peer(peer, xff));
        async move { r.await.unwrap().status() }
    };
    let per_64 = app(RateLimitLayer::new(
        c.rate_limiter("per-64", RateLimit::per_minute(1)),
        PeerIp::default(),
    ));
    assert_eq!(status(&per_64, "2001:db8:1:2::1", None).await, 200);
    for rotated in ["2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff"] {
        let s = status(&per_64, rotated, None).await;
        assert_eq!(s, 429, "{rotated} escaped its /64's quota");
    }
    assert_eq!(status(&per_64, "2001:db8:1:3::1", None).await, 200);
    // IPv4 and IPv4-mapped IPv6 are one client.
    assert_eq!(status(&per_64, "198.51.100.7", None).await, 200);
    assert_eq!(status(&per_64, "::ffff:198.51.100.7", None).await, 429);

    let per_128 = app(RateLimitLayer::new(
        c.rate_limiter("per-128", RateLimit::per_minute(1)),
        PeerIp::new().ipv6_prefix(128),
    ));
    assert_eq!(status(&per_128, "2001:db8:1:2::1", None).await, 200);
    assert_eq!(status(&per_128, "2001:db8:1:2::2", None).await, 200);

    // Behind a trusted proxy, the forwarded IPv6 client is keyed by its /64 too.
    let proxies = ForwardedFor::trusting(["10.0.0.0/8"]).unwrap();
    let forwarded = app(RateLimitLayer::new(
        c.rate_limiter("xff-64", RateLimit::per_minute(1)),
        proxies,
    ));
    assert_eq!(
        status(&forwarded, "10.0.0.5", Some("2001:db8:9::1")).await,
        200
    );
    assert_eq!(
        status(&forwarded, "10.0.0.5", Some("2001:db8:9::2")).await,
        429
    );
}
