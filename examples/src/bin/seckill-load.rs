//! `seckill-load`: a flash sale against two `seckill-server` instances, and its verdict.
//!
//! ```text
//! seckill-load [--buyers B] [--stock S] [--targets URL,URL] [--server-bin PATH]
//! ```
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

use lock_examples::seckill::instances::{BoxError, Instance, server_binary, shutdown_signal};
use lock_examples::seckill::load::{self, LoadConfig, Verdict};
use lock_tests::RedisServer;

const USAGE: &str =
    "usage: seckill-load [--buyers B] [--stock S] [--targets URL,URL] [--server-bin PATH]
  --buyers B         concurrent buyers, each a distinct user (default 2000)
  --stock S          units of the voucher on sale (default 100)
  --targets URL,URL  running instances to use (sharing one Redis and one SQLite file);
                     default: start redis-server and two seckill-server instances
  --server-bin PATH  the seckill-server binary (default: the one beside this program)";

struct Args {
    config: LoadConfig,
    targets: Vec<String>,
    server_bin: Option<PathBuf>,
}

fn parse_args() -> Result<Args, BoxError> {
    let mut args = Args {
        config: LoadConfig {
            buyers: 2000,
            stock: 100,
        },
        targets: Vec::new(),
        server_bin: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{arg} needs a value (see --help)"))?;
        let number = |v: &str| -> Result<u32, BoxError> {
            v.parse::<u32>()
                .ok()
                .filter(|n| (1..=1_000_000).contains(n))
                .ok_or_else(|| format!("{arg}: expected 1 to 1000000, got {v:?}").into())
        };
        match arg.as_str() {
            "--buyers" => args.config.buyers = number(&value)? as usize,
            "--stock" => args.config.stock = number(&value)?,
            "--targets" => {
                args.targets = value
                    .split(',')
                    .map(|t| t.trim().trim_end_matches('/').to_string())
                    .filter(|t| !t.is_empty())
                    .collect()
            }
            "--server-bin" => args.server_bin = Some(value.into()),
            other => return Err(format!("unknown option {other:?} (see --help)").into()),
        }
    }
    Ok(args)
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
        args.config.stock, args.config.buyers
    );
    let verdict = load::run(args.config, &urls).await;
    for mut i in instances {
        i.kill().await;
    }
    verdict
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = async {
        let args = parse_args()?;
        let run = async {
            if args.targets.is_empty() {
                run_local(&args).await
            } else {
                load::run(args.config, &args.targets).await
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
