//! `seckill-load`: a flash sale against two `seckill-server` instances, and its verdict.
//!
//! Without `--targets` it starts everything itself and removes it at the end: a private
//! `redis-server` on a free port (the test harness's `RedisServer`), the database (a
//! temporary SQLite file, or with `--db mysql` a private MariaDB), the queue (the Redis
//! Stream, or with `--queue rabbitmq` a private RabbitMQ node), and two
//! `seckill-server` processes on two ports (the binary beside this one, or
//! `--server-bin`). With `--targets` it uses running instances (which must share one
//! Redis, one database and one queue). `--sales N` runs N sales back to back, each with
//! its verdict. Exit status: 0 when every check of every sale holds, 1 on any
//! violation, 2 when the run could not be made.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;

use lock_examples::seckill::instances::{BoxError, Instance, server_binary, shutdown_signal};
use lock_examples::seckill::load::{self, LoadConfig, Verdict};
use lock_tests::{MariaDbServer, RabbitMqServer, RedisServer};

/// The database a local run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Db {
    /// A temporary SQLite file.
    Sqlite,
    /// A private MariaDB server (as MySQL), committing durably.
    Mysql,
}

/// The queue a local run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Queue {
    /// The Redis Stream on the run's redis-server.
    Stream,
    /// A private RabbitMQ node.
    Rabbitmq,
}

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
    /// The database a local run starts.
    #[arg(long, value_enum, default_value = "sqlite", conflicts_with = "targets")]
    db: Db,
    /// The queue a local run uses.
    #[arg(long, value_enum, default_value = "stream", conflicts_with = "targets")]
    queue: Queue,
    /// Sales to run back to back, each on a voucher of its own and judged alone.
    #[arg(long, default_value = "1", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    sales: u32,
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
/// `args.sales` sales against `targets`, one after the other.
async fn sales(args: &Args, targets: &[String]) -> Result<Vec<Verdict>, BoxError> {
    let mut verdicts = Vec::new();
    for _ in 0..args.sales {
        verdicts.push(load::run(args.config(), targets).await?);
    }
    Ok(verdicts)
}

async fn run_local(args: &Args) -> Result<Vec<Verdict>, BoxError> {
    let bin = match &args.server_bin {
        Some(bin) => bin.clone(),
        None => server_binary()?,
    };
    // Redis persists every write, as the service requires: it holds the stock, the
    // buyers and, until they are in the queue's hands, the accepted orders.
    let redis = RedisServer::start_with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    println!(
        "redis-server {} (private, port {})",
        redis.url(),
        redis.port()
    );
    let dir = TempDir::new()?;
    // Kept until the end: dropping them stops the servers.
    let (mut mariadb, mut rabbitmq) = (None, None);
    let db = match args.db {
        Db::Sqlite => dir.0.join("orders.db").display().to_string(),
        Db::Mysql => {
            let server = tokio::task::spawn_blocking(|| {
                MariaDbServer::start_with_args(&["--innodb-flush-log-at-trx-commit=1"])
            })
            .await?;
            let url = server.url();
            println!("mariadbd {url} (private)");
            mariadb = Some(server);
            url
        }
    };
    let queue = match args.queue {
        Queue::Stream => "stream".to_string(),
        Queue::Rabbitmq => {
            let server = tokio::task::spawn_blocking(RabbitMqServer::start).await?;
            let url = server.url();
            println!("rabbitmq-server {url} (private)");
            rabbitmq = Some(server);
            url
        }
    };
    let mut instances = Vec::new();
    for _ in 0..2 {
        let flags = ["--queue", queue.as_str()];
        instances.push(Instance::spawn(&bin, &redis.url(), &db, &flags).await?);
    }
    let urls: Vec<String> = instances.iter().map(|i| i.url.clone()).collect();
    println!(
        "seckill-server x2: {} (database {db}, queue {queue})",
        urls.join(", ")
    );
    let again = match args.sales {
        1 => String::new(),
        n => format!(", {n} sales back to back"),
    };
    println!(
        "selling {} units to {} concurrent buyers{again}...",
        args.stock, args.buyers
    );
    let verdicts = sales(args, &urls).await;
    for mut i in instances {
        i.kill().await;
    }
    drop((mariadb, rabbitmq));
    verdicts
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
                sales(&args, &targets).await
            }
        };
        tokio::select! {
            v = run => v,
            _ = shutdown_signal() => Err("interrupted".into()),
        }
    }
    .await;
    match result {
        Ok(verdicts) => {
            for verdict in &verdicts {
                println!("{verdict}");
            }
            if verdicts.iter().all(|v| v.violations().is_empty()) {
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
