//! A Redlock over several independent Redis masters: granted with a majority of them,
//! so the lock survives one node down.
//!
//! ```text
//! cargo run -p lock-examples --bin redlock                      # 3 throwaway servers
//! cargo run -p lock-examples --bin redlock -- redis://h1:6379/ redis://h2:6379/ redis://h3:6379/
//! ```
//!
//! With no URLs it starts three throwaway `redis-server`s and, after the first round,
//! stops one of them to show the majority still granting.

use std::time::Duration;

use clap::Parser;
use lock_core::{LockConfig, LockOptions, Redlock};
use lock_tests::RedisServer;

/// A Redlock over independent Redis masters, granted by a majority of them.
#[derive(Debug, Parser)]
struct Cli {
    /// The masters (redis:// URLs); none: three throwaway redis-servers, one of them
    /// stopped after the first round.
    urls: Vec<String>,
}

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn round(nodes: &[String], label: &str) -> Res {
    let a = Redlock::open(nodes.to_vec(), LockConfig::new())?;
    let b = Redlock::open(nodes.to_vec(), LockConfig::new())?;
    let options = LockOptions::new().wait(Duration::from_secs(5));
    let guard = a.acquire(("report", "nightly"), options).await?;
    println!(
        "{label}: client A holds report:nightly on a majority of {} nodes, valid for {} ms",
        nodes.len(),
        guard.valid_for().as_millis()
    );
    match b.try_lock(("report", "nightly")).await {
        Err(e) if e.is_busy() => println!("{label}: client B is refused while A holds it"),
        Err(e) => return Err(e.into()),
        Ok(_) => return Err("client B got the lock A holds".into()),
    }
    guard.release().await?;
    let again = b.try_lock(("report", "nightly")).await?;
    println!("{label}: after A's release client B takes it");
    again.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() {
    let urls = Cli::parse().urls;
    let result = async {
        if !urls.is_empty() {
            return round(&urls, "given nodes").await;
        }
        let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let nodes: Vec<String> = servers.iter().map(RedisServer::url).collect();
        round(&nodes, "3 of 3 nodes up").await?;
        servers[2].kill();
        round(&nodes, "2 of 3 nodes up").await
    }
    .await;
    if let Err(e) = result {
        eprintln!("redlock: {e}");
        std::process::exit(1);
    }
}
