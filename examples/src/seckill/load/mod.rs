//! The load generator: a flash sale against running instances, and its [`Verdict`].
//!
//! [`run`] creates a voucher with `stock` units, then starts `buyers` buyers at the same
//! instant, spread round-robin over the instances (the generator is the load
//! balancer). Every buyer is a distinct user; by their number:
//! - 1 in 50 is **greedy** (a bot): 10 orders at once with fresh keys, alternating
//!   instances; expected answers: at most one 201, then 409 or 429;
//! - 5 in 50 **try twice**: a second order with a fresh key on the other instance after
//!   the first answer (409 `already-ordered` or 410 `sold-out` expected);
//! - 5 in 50 **retry** with the same `Idempotency-Key` on the other instance, as a
//!   client does after a timeout: the first answer must come back replayed, identical;
//! - the rest order once.
//!
//! Then it waits until the workers have drained the queue (`GET /healthz`), reads the
//! voucher and its persisted orders, and checks the result ([`Verdict::violations`]).

mod http;
mod verdict;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use super::instances::BoxError;
pub use http::{Http, Reply};
pub use verdict::{Attempt, Verdict};

/// How long the workers get to drain the queue after the last buyer.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);
/// Orders a greedy buyer fires at once.
const GREEDY_BURST: usize = 10;

/// What a buyer does (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// One order.
    Once,
    /// A second order with a fresh key after the first answer.
    Twice,
    /// The same request again with the same key after the first answer.
    Retry,
    /// Many orders at once.
    Greedy,
}

impl Behaviour {
    /// The behaviour of buyer number `i`.
    pub fn of(i: usize) -> Self {
        match i % 50 {
            0 => Behaviour::Greedy,
            1..=5 => Behaviour::Twice,
            6..=10 => Behaviour::Retry,
            _ => Behaviour::Once,
        }
    }
}

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct LoadConfig {
    /// Concurrent buyers (distinct users).
    pub buyers: usize,
    /// Units of stock on sale.
    pub stock: u32,
}

impl LoadConfig {
    /// The order requests one sale of this size sends: every buyer's, by behaviour.
    pub fn requests(&self) -> usize {
        (0..self.buyers).map(|i| Behaviour::of(i).requests()).sum()
    }
}

impl Behaviour {
    /// The order requests a buyer of this behaviour sends.
    pub fn requests(self) -> usize {
        match self {
            Behaviour::Once => 1,
            Behaviour::Twice | Behaviour::Retry => 2,
            Behaviour::Greedy => GREEDY_BURST,
        }
    }
}

/// Runs the sale against `targets` (base URLs of instances sharing one Redis and one
/// database) and returns the verdict.
pub async fn run(config: LoadConfig, targets: &[String]) -> Result<Verdict, BoxError> {
    if targets.is_empty() {
        return Err("no target instance".into());
    }
    let http = Http::new();
    let voucher = http
        .create_voucher(&targets[0], format!("{{\"stock\": {}}}", config.stock))
        .await?;
    // Distinct users per voucher, so runs against one Redis do not share rate limits.
    let first_user = voucher * 10_000_000;
    let start = Arc::new(Barrier::new(config.buyers + 1));
    let targets: Arc<[String]> = targets.into();
    let mut handles = Vec::with_capacity(config.buyers);
    for i in 0..config.buyers {
        let (http, start, targets) = (http.clone(), start.clone(), targets.clone());
        let user = first_user + i as i64 + 1;
        handles.push(tokio::spawn(async move {
            start.wait().await;
            buy(&http, &targets, i, voucher, user).await
        }));
    }
    start.wait().await;
    let began = Instant::now();
    let mut attempts = Vec::with_capacity(config.buyers * 2);
    for h in handles {
        attempts.extend(h.await?);
    }
    let elapsed = began.elapsed();

    let drained = wait_drained(&http, &targets).await;
    let state = http
        .get(&format!("{}/vouchers/{voucher}", targets[0]))
        .await?
        .json();
    let listed = http
        .get(&format!("{}/vouchers/{voucher}/orders", targets[0]))
        .await?
        .json();
    let rows = listed
        .get("orders")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| format!("GET /vouchers/{voucher}/orders answered {listed}"))?
        .iter()
        .filter_map(|o| {
            Some((
                o.get("order_id")?.as_str()?.to_owned(),
                o.get("user_id")?.as_i64()?,
            ))
        })
        .collect();
    let field = |name: &str| state.get(name).and_then(serde_json::Value::as_i64);
    Ok(Verdict::new(
        verdict::Run {
            instances: targets.to_vec(),
            voucher,
            stock: config.stock,
            buyers: config.buyers,
            elapsed,
            drained,
            stock_left: field("stock_left"),
            sold: field("sold"),
        },
        attempts,
        rows,
    ))
}

/// One buyer's requests.
async fn buy(http: &Http, targets: &[String], i: usize, voucher: i64, user: i64) -> Vec<Attempt> {
    let target = |n: usize| targets[(i + n) % targets.len()].as_str();
    let key = |n: usize| format!("buyer-{user}-{n}");
    let one = |n: usize, key: String| async move {
        let reply = http.order(target(n), voucher, user, &key).await;
        Attempt::new(user, key, reply)
    };
    match Behaviour::of(i) {
        Behaviour::Once => vec![one(0, key(0)).await],
        Behaviour::Twice => vec![one(0, key(0)).await, one(1, key(1)).await],
        Behaviour::Retry => vec![one(0, key(0)).await, one(1, key(0)).await],
        Behaviour::Greedy => {
            futures_util::future::join_all((0..GREEDY_BURST).map(|n| one(n, key(n)))).await
        }
    }
}

/// Polls `GET /healthz` of every instance until the queue is drained by all of them
/// (RabbitMQ's `pending` counts one instance's deliveries); false on timeout.
async fn wait_drained(http: &Http, targets: &[String]) -> bool {
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while Instant::now() < deadline {
        let mut drained = true;
        for base in targets {
            let queue = match http.get(&format!("{base}/healthz")).await {
                Ok(reply) => reply.json()["queue"].clone(),
                Err(_) => serde_json::Value::Null,
            };
            drained &= queue["pending"].as_u64() == Some(0) && queue["undelivered"] == false;
        }
        if drained {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}
