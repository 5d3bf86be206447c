//! A second OS process for the semaphore suite. Not a user tool.
//!
//! `semaphore-worker count URL NAME LIMIT TASKS ITERS HOLD_US`
//!   TASKS tasks each acquire ITERS times from the semaphore NAME with LIMIT permits
//!   (2 permits every third time, else 1). After each grant the task adds its permits to
//!   the Redis counter `in-use:NAME` (INCRBY) and records the value it got back, holds
//!   for HOLD_US, subtracts them again (DECRBY) and releases. Prints
//!   `done <acquisitions> <permits> <max in use seen> <short releases>` and exits.
//! `semaphore-worker hold URL NAME LIMIT N LEASE_MS`
//!   Takes N permits with a lease of LEASE_MS, prints `held <id> ...`, then waits for a
//!   line on stdin (the suite kills it first) and releases.

use std::io::BufRead;
use std::time::Duration;

use lock_core::{LockClient, LockError, SemaphoreOptions};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("count") => count(&args[1..]).await,
        Some("hold") => hold(&args[1..]).await,
        _ => Err("usage: semaphore-worker count|hold ...".into()),
    };
    if let Err(e) = result {
        eprintln!("semaphore-worker: {e}");
        std::process::exit(1);
    }
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> Result<T, String> {
    args.get(i)
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("argument {i} missing or malformed"))
}

#[derive(Default)]
struct Tally {
    acquisitions: u64,
    permits: u64,
    max_in_use: i64,
    short_releases: u64,
}

async fn count(args: &[String]) -> Res {
    let url: String = arg(args, 0)?;
    let name: String = arg(args, 1)?;
    let (limit, tasks, iters, hold_us): (u32, usize, usize, u64) =
        (arg(args, 2)?, arg(args, 3)?, arg(args, 4)?, arg(args, 5)?);
    let client = LockClient::open(url.as_str()).await?;
    let semaphore = client.semaphore(name.as_str(), limit)?;
    let redis = redis::Client::open(url.as_str())?;
    let counter = format!("in-use:{name}");
    let opts = SemaphoreOptions::new()
        .lease(Duration::from_secs(10))
        .wait(Duration::from_secs(60));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let semaphore = semaphore.clone();
        let counter = counter.clone();
        let mut conn = lock_tests::connect(&redis).await?;
        handles.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            for i in 0..iters {
                let n: u32 = if (t + i).is_multiple_of(3) { 2 } else { 1 };
                let permits = semaphore.acquire(n, opts).await?;
                let in_use: i64 = redis::cmd("INCRBY")
                    .arg(&counter)
                    .arg(n)
                    .query_async(&mut conn)
                    .await
                    .map_err(LockError::from)?;
                tally.max_in_use = tally.max_in_use.max(in_use);
                tokio::time::sleep(Duration::from_micros(hold_us)).await;
                let _: i64 = redis::cmd("DECRBY")
                    .arg(&counter)
                    .arg(n)
                    .query_async(&mut conn)
                    .await
                    .map_err(LockError::from)?;
                if permits.release().await? != n as usize {
                    tally.short_releases += 1;
                }
                tally.acquisitions += 1;
                tally.permits += u64::from(n);
            }
            Ok::<_, LockError>(tally)
        }));
    }
    let mut total = Tally::default();
    for h in handles {
        let t = h.await??;
        total.acquisitions += t.acquisitions;
        total.permits += t.permits;
        total.max_in_use = total.max_in_use.max(t.max_in_use);
        total.short_releases += t.short_releases;
    }
    println!(
        "done {} {} {} {}",
        total.acquisitions, total.permits, total.max_in_use, total.short_releases
    );
    Ok(())
}

async fn hold(args: &[String]) -> Res {
    let url: String = arg(args, 0)?;
    let name: String = arg(args, 1)?;
    let (limit, n, lease_ms): (u32, u32, u64) = (arg(args, 2)?, arg(args, 3)?, arg(args, 4)?);
    let client = LockClient::open(url.as_str()).await?;
    let semaphore = client.semaphore(name.as_str(), limit)?;
    let opts = SemaphoreOptions::new()
        .lease(Duration::from_millis(lease_ms))
        .wait(Duration::from_secs(5));
    let permits = semaphore.acquire(n, opts).await?;
    println!("held {}", permits.ids().join(" "));
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)
    })
    .await??;
    let released = permits.release().await?;
    println!("released {released}");
    Ok(())
}
