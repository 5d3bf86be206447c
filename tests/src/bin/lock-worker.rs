//! A second OS process for the cross-process suites. Not a user tool.
//!
//! `lock-worker count URL TASKS ITERS KEYS SLEEP_US [--no-lock] [--no-batching] [--data DATA_URL]`
//!   TASKS tasks each take ITERS locks round-robin over KEYS keys of the lock store URL
//!   names (any `AnyLocks` URL); inside each lock a deliberately non-atomic GET, sleep,
//!   SET increments `counter:<k>` on the redis-server DATA_URL (default: URL). Prints
//!   `done <acquisitions of key 0> <key 1> ...` and exits.
//! `lock-worker hold URL KEY LEASE_MS`
//!   Takes KEY under the watchdog (lease LEASE_MS), prints `token <n>`, waits for a line
//!   on stdin, then prints `report held=<bool> lost=<bool> write=<..> release=<..>`.
//! `lock-worker redlock-count DATA_URL LOCK_URLS TASKS ITERS KEYS SLEEP_US`
//!   As `count`, with a `Redlock` over the comma-separated LOCK_URLS (watchdog lease
//!   2 s, per-node timeout 300 ms) and the counters on DATA_URL. Acquisitions that fail
//!   for want of a quorum are retried; prints `done <per key...> failed <n>` where
//!   `failed` counts acquire errors (the critical section did not run then).
//! `lock-worker cluster-count SEED_URLS TASKS ITERS KEYS SLEEP_US`
//!   As `count`, with a `LockClient` on the Redis Cluster reached through the
//!   comma-separated SEED_URLS, counters on the cluster too. Redis errors (a failover
//!   under way) are retried. Prints `done <per key...> lost <n> errors <m>`: `lost`
//!   counts critical sections whose lock was reported lost (`is_held()` false after
//!   the write, or a release answering expired / not owner), `errors` Redis errors.
//! `lock-worker rate URL KEY RATE_PER_S BURST MILLIS`
//!   Checks KEY against a GCRA limit as fast as it can for MILLIS ms; prints
//!   `admitted <n> refused <m>`.

use std::io::BufRead;
use std::time::Duration;

use lock_core::{AnyLocks, FencedWrite, HeldLock, LockClient, LockConfig, LockError, LockOptions};
use redis::AsyncCommands;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("count") => count(&args[1..]).await,
        Some("hold") => hold(&args[1..]).await,
        Some("rate") => rate(&args[1..]).await,
        Some("redlock-count") => redlock_count(&args[1..]).await,
        Some("cluster-count") => cluster_count(&args[1..]).await,
        _ => Err("usage: lock-worker count|hold ...".into()),
    };
    if let Err(e) = result {
        eprintln!("lock-worker: {e}");
        std::process::exit(1);
    }
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T, String> {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("argument {i} missing or malformed"))
}

async fn count(args: &[String]) -> Res {
    let url: String = arg(args, 0)?;
    let (tasks, iters, keys, sleep_us): (usize, usize, usize, u64) =
        (arg(args, 1)?, arg(args, 2)?, arg(args, 3)?, arg(args, 4)?);
    let use_lock = !args.iter().any(|a| a == "--no-lock");
    let batching = !args.iter().any(|a| a == "--no-batching");
    let data_url = match args.iter().position(|a| a == "--data") {
        Some(i) => arg::<String>(args, i + 1)?,
        None => url.clone(),
    };
    let config = LockConfig::new()
        .with_wait(Duration::from_secs(60))
        .with_batching(batching);
    let client = AnyLocks::open(url.as_str(), config).await?;
    let redis = redis::Client::open(data_url.as_str())?;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let client = client.clone();
        let mut conn = lock_tests::connect(&redis).await?;
        handles.push(tokio::spawn(async move {
            let mut per_key = vec![0u64; keys];
            for i in 0..iters {
                let k = (t + i) % keys;
                let guard = if use_lock {
                    Some(client.acquire(("counter", k), LockOptions::new()).await?)
                } else {
                    None
                };
                let counter = format!("counter:{k}");
                let v: Option<u64> = conn.get(&counter).await.map_err(LockError::from)?;
                tokio::time::sleep(Duration::from_micros(sleep_us)).await;
                let _: () = conn
                    .set(&counter, v.unwrap_or(0) + 1)
                    .await
                    .map_err(LockError::from)?;
                if let Some(g) = guard {
                    match g.release().await {
                        // The store could not confirm the release in time (Redlock
                        // nodes slower than their timeout on a loaded machine). The
                        // update is done, and the hold lasts until a majority lets it
                        // go (its lease at the latest): nobody got in beside it.
                        Err(e) if e.is_unavailable() => {
                            eprintln!("lock-worker: release not confirmed: {e}")
                        }
                        other => {
                            other?;
                        }
                    }
                }
                per_key[k] += 1;
            }
            Ok::<_, LockError>(per_key)
        }));
    }
    let mut totals = vec![0u64; keys];
    for h in handles {
        for (k, n) in h.await??.into_iter().enumerate() {
            totals[k] += n;
        }
    }
    let line: Vec<String> = totals.iter().map(u64::to_string).collect();
    println!("done {}", line.join(" "));
    Ok(())
}

async fn hold(args: &[String]) -> Res {
    let url: String = arg(args, 0)?;
    let key: String = arg(args, 1)?;
    let lease_ms: u64 = arg(args, 2)?;
    let lease = Duration::from_millis(lease_ms);
    let config = LockConfig::new().with_watchdog_lease(lease);
    let client = LockClient::open_with_config(url.as_str(), config).await?;
    let guard = client.try_lock(key.as_str()).await?;
    let token = guard.fence().await?;
    println!("token {token}");
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)
    })
    .await??;
    let held = guard.is_held();
    let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .is_ok();
    let write = match client
        .fenced_write(key.as_str(), token, "from-worker")
        .await?
    {
        FencedWrite::Written => "written".to_string(),
        FencedWrite::Refused { highest } => format!("refused-by-{highest}"),
        other => format!("{other:?}"),
    };
    let release = match guard.release().await {
        Ok(r) => format!("{r:?}"),
        Err(e) if e.is_not_owner() => "not-owner".into(),
        Err(e) if e.is_expired() => "expired".into(),
        Err(e) => return Err(e.into()),
    };
    println!("report held={held} lost={lost} write={write} release={release}");
    Ok(())
}

async fn rate(args: &[String]) -> Res {
    let url: String = arg(args, 0)?;
    let key: String = arg(args, 1)?;
    let (per_s, burst, millis): (u32, u32, u64) = (arg(args, 2)?, arg(args, 3)?, arg(args, 4)?);
    let client = LockClient::open(url.as_str()).await?;
    let limiter = client.rate_limiter(
        "shared",
        lock_core::RateLimit::per_second(per_s).with_burst(burst),
    );
    let until = std::time::Instant::now() + Duration::from_millis(millis);
    let (mut admitted, mut refused) = (0u64, 0u64);
    while std::time::Instant::now() < until {
        if limiter.check(key.as_str()).await?.allowed {
            admitted += 1;
        } else {
            refused += 1;
        }
    }
    println!("admitted {admitted} refused {refused}");
    Ok(())
}

async fn redlock_count(args: &[String]) -> Res {
    let data_url: String = arg(args, 0)?;
    let lock_urls: String = arg(args, 1)?;
    let (tasks, iters, keys, sleep_us): (usize, usize, usize, u64) =
        (arg(args, 2)?, arg(args, 3)?, arg(args, 4)?, arg(args, 5)?);
    let config = LockConfig::new()
        .with_wait(Duration::from_secs(60))
        .with_watchdog_lease(Duration::from_secs(2))
        .with_command_timeout(Duration::from_secs(1));
    let redlock = lock_core::Redlock::open(lock_urls.split(','), config)?
        .with_node_timeout(Duration::from_millis(300))?;
    let redis = redis::Client::open(data_url.as_str())?;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let redlock = redlock.clone();
        let mut conn = lock_tests::connect(&redis).await?;
        handles.push(tokio::spawn(async move {
            let mut per_key = vec![0u64; keys];
            let mut failed = 0u64;
            let mut i = 0;
            while i < iters {
                let k = (t + i) % keys;
                let guard = match redlock.acquire(("counter", k), LockOptions::new()).await {
                    Ok(g) => g,
                    Err(e) if e.is_no_quorum() => {
                        // Nodes being killed under us: try the same iteration again.
                        failed += 1;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let counter = format!("counter:{k}");
                let v: Option<u64> = conn.get(&counter).await.map_err(LockError::from)?;
                tokio::time::sleep(Duration::from_micros(sleep_us)).await;
                let _: () = conn
                    .set(&counter, v.unwrap_or(0) + 1)
                    .await
                    .map_err(LockError::from)?;
                // A release that misses the quorum leaves copies to their lease; the
                // counter was written under the lock either way.
                let _ = guard.release().await;
                per_key[k] += 1;
                i += 1;
            }
            Ok::<_, LockError>((per_key, failed))
        }));
    }
    let mut totals = vec![0u64; keys];
    let mut failed = 0;
    for h in handles {
        let (per_key, f) = h.await??;
        failed += f;
        for (k, n) in per_key.into_iter().enumerate() {
            totals[k] += n;
        }
    }
    let line: Vec<String> = totals.iter().map(u64::to_string).collect();
    println!("done {} failed {failed}", line.join(" "));
    Ok(())
}

async fn cluster_count(args: &[String]) -> Res {
    let seeds: String = arg(args, 0)?;
    let (tasks, iters, keys, sleep_us): (usize, usize, usize, u64) =
        (arg(args, 1)?, arg(args, 2)?, arg(args, 3)?, arg(args, 4)?);
    let config = LockConfig::new()
        .with_wait(Duration::from_secs(60))
        .with_watchdog_lease(Duration::from_secs(3))
        .with_command_timeout(Duration::from_secs(2));
    let client = LockClient::open_cluster(seeds.split(','), config).await?;
    let data = redis::cluster::ClusterClient::builder(seeds.split(','))
        .retries(10)
        .build()?
        .get_async_connection()
        .await?;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let (client, conn) = (client.clone(), data.clone());
        handles.push(tokio::spawn(async move {
            let mut per_key = vec![0u64; keys];
            let (mut lost, mut errors) = (0u64, 0u64);
            let mut i = 0;
            while i < iters {
                let k = (t + i) % keys;
                let guard = match client.acquire(("counter", k), LockOptions::new()).await {
                    Ok(g) => g,
                    Err(e) if e.is_redis() => {
                        errors += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                };
                let counter = format!("counter:{k}");
                let v: Option<u64> = retry(&mut errors, || {
                    let (mut c, key) = (conn.clone(), counter.clone());
                    async move { c.get(key).await }
                })
                .await?;
                tokio::time::sleep(Duration::from_micros(sleep_us)).await;
                let next = v.unwrap_or(0) + 1;
                let () = retry(&mut errors, || {
                    let (mut c, key) = (conn.clone(), counter.clone());
                    async move { c.set(key, next).await }
                })
                .await?;
                let mut was_lost = !guard.is_held();
                match guard.release().await {
                    Ok(_) => {}
                    Err(e) if e.is_lost() => was_lost = true,
                    Err(e) if e.is_redis() => errors += 1,
                    Err(e) => return Err(e),
                }
                lost += u64::from(was_lost);
                per_key[k] += 1;
                i += 1;
            }
            Ok::<_, LockError>((per_key, lost, errors))
        }));
    }
    let mut totals = vec![0u64; keys];
    let (mut lost, mut errors) = (0, 0);
    for h in handles {
        let (per_key, l, e) = h.await??;
        lost += l;
        errors += e;
        for (k, n) in per_key.into_iter().enumerate() {
            totals[k] += n;
        }
    }
    let line: Vec<String> = totals.iter().map(u64::to_string).collect();
    println!("done {} lost {lost} errors {errors}", line.join(" "));
    Ok(())
}

/// Retries a cluster command through a failover (up to ~10 s), counting the errors.
async fn retry<T, F, Fut>(errors: &mut u64, mut op: F) -> Result<T, LockError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redis::RedisResult<T>>,
{
    let mut attempts = 0;
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(_) if attempts < 200 => {
                *errors += 1;
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
