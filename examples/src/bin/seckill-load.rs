//! `seckill-load`: a flash sale against two `seckill-server` instances, and its verdict.
//!
//! Without `--targets` it starts everything itself and removes it at the end: a private
//! `redis-server` on a free port (the test harness's `RedisServer`), a temporary SQLite
//! file, and two `seckill-server` processes on two ports (the binary beside this one,
//! or `--server-bin`). With `--targets` it uses running instances (which must share one
//! Redis and one database). Exit status: 0 when every check holds, 1 on any violation,
//! 2 when the run could not be made.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;

use lock_examples::seckill::instances::{BoxError, Instance, server_binary, shutdown_signal};
use lock_examples::seckill::load::{self, LoadConfig, Verdict};
use lock_tests::RedisServer;

/// A flash sale against two seckill-server instances, and its verdict.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Concurrent buyers, each a distinct user.
    #[arg(long, default_value = "2000", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    buyers: u32,
    /// Units of the voucher on sale.
    #[arg(long, default_value = "100", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    stock: u32,
    /// Running instances to use, comma-separated (sharing one Redis and one database);
    /// default: start redis-server and two seckill-server instances.
    #[arg(long, value_delimiter = ',', value_name = "URL,URL")]
    targets: Vec<String>,
    /// The seckill-server binary (default: the one beside this program).
    #[arg(long, value_name = "PATH")]
    server_bin: Option<PathBuf>,
}

impl Args {
    fn config(&self) -> LoadConfig {
        LoadConfig {
            buyers: self.buyers as usize,
            stock: self.stock,
        }
    }

    /// The targets without trailing slashes or empty items.
    fn targets(&self) -> Vec<String> {
        self.targets
            .iter()
            .map(|t| t.trim().trim_end_matches('/').to_string())
            .filter(|t| !t.is_empty())
            .collect()
    }
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<Self, BoxError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir =
            std::env::temp_dir().join(format!("seckill-load-{}-{nanos:08x}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Ok(Self(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts redis-server and two instances, runs the sale, and tears everything down.
async fn run_local(args: &Args) -> Result<Verdict, BoxError> {
    let bin = match &args.server_bin {
        Some(bin) => bin.clone(),
        None => server_binary()?,
    };
    // Redis persists every write, as the service requires: it is the only record of
    // an accepted order until a worker writes it into SQLite.
    let redis = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let dir = TempDir::new()?;
    let db = dir.0.join("orders.db");
    println!(
        "redis-server {} (private, port {})",
        redis.url(),
        redis.port()
    );
    let mut instances = Vec::new();
    for _ in 0..2 {
        instances.push(Instance::spawn(&bin, &redis.url(), &db, &[]).await?);
    }
    let urls: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
    println!(
        "seckill-server x2: {} (SQLite {})",
        urls.join(", "),
        db.display()
    );
    println!(
        "selling {} units to {} concurrent buyers...",
        args.stock, args.buyers
    );
    let verdict = load::run(args.config(), &urls).await;
    for mut i in instances {
        i.kill().await;
    }
    verdict
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = async {
        let targets = args.targets();
        let run = async {
            if targets.is_empty() {
                run_local(&args).await
            } else {
                load::run(args.config(), &targets).await
            }
        };
        tokio::select! {
            v = run => v,
            _ = shutdown_signal() => Err("interrupted".into()),
        }
    }
    .await;
    match result {
        Ok(verdict) => {
            println!("{verdict}");
            if verdict.violations().is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("seckill-load: {e}");
            ExitCode::from(2)
        }
    }
}
