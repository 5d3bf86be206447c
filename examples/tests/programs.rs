//! The small example programs, each run as a process against servers the harness starts,
//! with what each promises checked over HTTP or from its exit status and output.

use std::path::Path;
use std::process::Output;

use http::Method;
use lock_examples::programs::start;
use lock_examples::seckill::load::{Http, Reply};
use lock_tests::{MariaDbServer, PostgresServer, RedisServer, ZooKeeperServer};

fn bin(name: &str) -> &'static Path {
    match name {
        "cache-lock-axum" => Path::new(env!("CARGO_BIN_EXE_cache-lock-axum")),
        "payments" => Path::new(env!("CARGO_BIN_EXE_payments")),
        "rate-limited-api" => Path::new(env!("CARGO_BIN_EXE_rate-limited-api")),
        "redlock" => Path::new(env!("CARGO_BIN_EXE_redlock")),
        "lock-by-url" => Path::new(env!("CARGO_BIN_EXE_lock-by-url")),
        other => panic!("no program {other}"),
    }
}

fn text(r: &Reply) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_lock_axum_refuses_a_users_second_order_while_the_first_runs() {
    let redis = RedisServer::start();
    let app = start(bin("cache-lock-axum"), &redis.url(), &[])
        .await
        .unwrap();
    let http = Http::new();
    let order = |user: u32| {
        let (http, url) = (http.clone(), format!("{}/users/{user}/orders", app.url));
        async move { http.send(Method::POST, &url, &[], None).await.unwrap() }
    };
    // Both arrive while the first one's two seconds of work run.
    let (a, b, other) = tokio::join!(order(7), order(7), order(8));
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    let refused = if a.status == 409 { &a } else { &b };
    assert_eq!(refused.content_type, "application/problem+json");
    assert!(refused.retry_after.is_some(), "{refused:?}");
    assert_eq!(other.status, 200, "another user is not blocked: {other:?}");
    // Released on return: the next order of user 7 goes through.
    let again = order(7).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(text(&again), "order placed for user 7\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payments_charges_once_per_idempotency_key() {
    let redis = RedisServer::start();
    let app = start(bin("payments"), &redis.url(), &[]).await.unwrap();
    let http = Http::new();
    let pay = |key: &str, body: &str| {
        let headers = [
            ("authorization", "Bearer alice".to_string()),
            ("idempotency-key", format!("\"{key}\"")),
        ];
        let (http, url, body) = (
            http.clone(),
            format!("{}/payments", app.url),
            body.to_string(),
        );
        async move {
            http.send(Method::POST, &url, &headers, Some(body))
                .await
                .unwrap()
        }
    };
    let first = pay("pay-1", r#"{"cents":500}"#).await;
    assert_eq!(first.status, 201, "{first:?}");
    assert!(!first.replayed);
    let retry = pay("pay-1", r#"{"cents":500}"#).await;
    assert_eq!(retry.status, 201, "{retry:?}");
    assert!(retry.replayed, "the retry is a replay: {retry:?}");
    assert_eq!(retry.body, first.body, "byte for byte");
    let other_body = pay("pay-1", r#"{"cents":900}"#).await;
    assert_eq!(other_body.status, 422, "{other_body:?}");
    let second = pay("pay-2", r#"{"cents":900}"#).await;
    assert_eq!(second.status, 201, "{second:?}");
    let charges = http
        .send(Method::GET, &format!("{}/charges", app.url), &[], None)
        .await
        .unwrap();
    assert_eq!(text(&charges), "2\n", "one charge per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_api_allows_three_a_minute_per_key() {
    let redis = RedisServer::start();
    let app = start(bin("rate-limited-api"), &redis.url(), &[])
        .await
        .unwrap();
    let http = Http::new();
    let hello = |key: Option<&str>| {
        let headers: Vec<(&str, String)> = key
            .map(|k| ("x-api-key", k.to_string()))
            .into_iter()
            .collect();
        let (http, url) = (http.clone(), format!("{}/hello", app.url));
        async move { http.send(Method::GET, &url, &headers, None).await.unwrap() }
    };
    for _ in 0..3 {
        let r = hello(Some("k1")).await;
        assert_eq!((r.status, text(&r).as_str()), (200, "hello\n"), "{r:?}");
    }
    let limited = hello(Some("k1")).await;
    assert_eq!(limited.status, 429, "{limited:?}");
    assert_eq!(limited.content_type, "application/problem+json");
    let retry: u64 = limited.retry_after.as_deref().unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "one unit back in 20 s: {retry}");
    assert_eq!(
        hello(Some("k2")).await.status,
        200,
        "another key has its own quota"
    );
    assert_eq!(
        hello(None).await.status,
        400,
        "no key, no quota to count on"
    );
}

fn run(name: &str, args: &[&str]) -> Output {
    let out = std::process::Command::new(bin(name))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn redlock_grants_with_a_majority_and_one_node_down() {
    let out = run("redlock", &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in [
        "3 of 3 nodes up: client B is refused while A holds it",
        "2 of 3 nodes up: client A holds report:nightly on a majority of 3 nodes",
        "2 of 3 nodes up: client B is refused while A holds it",
        "2 of 3 nodes up: after A's release client B takes it",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
}

#[test]
fn lock_by_url_runs_on_every_store() {
    let redis = RedisServer::start();
    let postgres = PostgresServer::start();
    let mariadb = MariaDbServer::start();
    let zk = ZooKeeperServer::start();
    for url in [
        redis.url(),
        "memory://".to_string(),
        postgres.url(),
        mariadb.url(),
        format!("zk://{}", zk.connect_string()),
    ] {
        let out = run("lock-by-url", &[&url]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("holding "), "{url}: {stdout}");
        assert!(
            stdout.contains("a second holder is refused"),
            "{url}: {stdout}"
        );
        assert!(stdout.ends_with("released\n"), "{url}: {stdout}");
    }
    let out = std::process::Command::new(bin("lock-by-url"))
        .arg("ftp://nowhere/")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lock-by-url: "),
        "an unknown scheme is a clear error"
    );
}
