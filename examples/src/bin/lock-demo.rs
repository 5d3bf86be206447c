//! Two processes contending for one lock.
//!
//! `cargo run -p lock-examples --bin lock-demo` starts a throwaway `redis-server` (or
//! uses `REDIS_URL`), then runs two copies of itself as separate OS processes. Each takes
//! the lock `demo:printer` five times, "prints a page" for 200 ms while holding it, and
//! releases it. The output shows the two processes taking turns, the fencing token
//! growing with every grant, and a `try_lock` bouncing off the held lock. Each page is
//! written with `fenced_write`, which would refuse a page from a stale holder: a worker
//! fails if that ever happens.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use lock_core::{FencedWrite, LockClient, LockConfig};
use lock_tests::RedisServer;

/// Two processes contending for one lock, taking turns.
#[derive(Debug, Parser)]
struct Cli {
    /// The Redis to use; default: a throwaway redis-server.
    #[arg(long, env = "REDIS_URL")]
    redis: Option<String>,
    #[command(subcommand)]
    role: Option<Role>,
}

#[derive(Debug, Subcommand)]
enum Role {
    /// One of the two contending processes (the demo starts them itself).
    Worker {
        /// The Redis URL.
        url: String,
        /// The worker's name in the output.
        name: String,
    },
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.role {
        Some(Role::Worker { url, name }) => worker(&url, &name).await,
        None => parent(cli.redis).await,
    };
    if let Err(e) = result {
        eprintln!("lock-demo: {e}");
        std::process::exit(1);
    }
}

type Res = Result<(), Box<dyn std::error::Error>>;

async fn worker(url: &str, name: &str) -> Res {
    let client = LockClient::open_with_config(url, LockConfig::new()).await?;
    for page in 1..=5 {
        match client.try_lock(("demo", "printer")).await {
            Ok(g) => {
                println!(
                    "[{name}] try_lock: free, got it at once (token {})",
                    g.fence().await?
                );
                g.release().await?;
            }
            Err(e) if e.is_busy() => println!("[{name}] try_lock: busy, so wait for it"),
            Err(e) => return Err(e.into()),
        }
        let started = Instant::now();
        let guard = client.lock(("demo", "printer")).await?;
        let token = guard.fence().await?;
        println!(
            "[{name}] page {page}: got the lock after {:>4} ms, fencing token {token}",
            started.elapsed().as_millis(),
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The printer only accepts pages from the newest holder (fencing).
        let page_text = format!("page {page} from {name}");
        match client.fenced_write("printer", token, page_text).await? {
            FencedWrite::Written => {}
            refused => {
                return Err(format!("[{name}] the printer refused a page: {refused:?}").into());
            }
        }
        guard.release().await?;
        println!("[{name}] page {page}: released");
        // Walk back from the printer, so the other process gets a turn.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn parent(redis: Option<String>) -> Res {
    // The same harness the tests use: a throwaway redis-server, killed on exit.
    let (url, _server) = match redis {
        Some(url) => (url, None),
        None => {
            let server = RedisServer::start();
            (server.url(), Some(server))
        }
    };
    println!("redis at {url}; starting two worker processes, A and B");
    let exe = std::env::current_exe()?;
    let spawn = |name: &str| {
        Command::new(&exe)
            .args(["worker", &url, name])
            .stdout(Stdio::inherit())
            .spawn()
    };
    let mut a = spawn("A")?;
    let mut b = spawn("B")?;
    let (sa, sb) = (a.wait()?, b.wait()?);
    if !sa.success() || !sb.success() {
        return Err("a worker failed".into());
    }
    println!("done: 10 pages printed, never two at once (tokens strictly increasing)");
    Ok(())
}
