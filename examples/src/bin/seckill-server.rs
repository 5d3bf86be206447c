//! `seckill-server`: the flash-sale service (see `lock_examples::seckill`).
//!
//! Prints `seckill-server listening on http://ADDR` on stdout once it accepts requests
//! (with `--listen 127.0.0.1:0` the port is picked by the OS); logs go to stderr
//! (`RUST_LOG`, default `info`). SIGINT or SIGTERM stop it gracefully. `--help` lists
//! the options.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

use clap::Parser;
use lock_examples::seckill::instances::shutdown_signal;
use lock_examples::seckill::server::{self, ServerConfig};

/// The flash-sale service: vouchers with a stock, one order per user, no oversell.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The Redis shared by every instance.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    redis: String,
    /// The orders database shared by every instance: a SQLite file, or
    /// mysql://USER:PASSWORD@HOST:PORT/DATABASE (MySQL or MariaDB, with
    /// innodb_flush_log_at_trx_commit=1).
    #[arg(long, env = "DATABASE_URL", default_value = "seckill.db")]
    db: String,
    /// The queue between the order path and the database: `stream` (a Redis Stream on
    /// --redis) or amqp://USER:PASSWORD@HOST:PORT/VHOST (RabbitMQ; %2f is the vhost /).
    #[arg(long, env = "AMQP_URL", default_value = "stream")]
    queue: String,
    /// Orders per second per user, on average.
    #[arg(long, default_value = "2")]
    user_rate: NonZeroU32,
    /// Orders per user at once.
    #[arg(long, default_value = "4")]
    user_burst: NonZeroU32,
    /// Pending stream entries idle this long (milliseconds) are claimed by a worker.
    #[arg(long, default_value = "5000")]
    claim_idle_ms: NonZeroU64,
    /// Start even if Redis does not persist (AOF off); by default the server refuses,
    /// since Redis holds accepted orders until the worker writes them.
    #[arg(long)]
    allow_volatile_redis: bool,
    /// The benchmark's floor: orders run the stock script alone (no lock, idempotency
    /// key or rate limit); never in production.
    #[arg(long)]
    floor: bool,
    /// Send every lock, rate-limit and idempotency call on its own instead of
    /// coalescing concurrent ones (LockConfig::with_batching).
    #[arg(long)]
    no_batching: bool,
    /// Fault injection for tests: exit once the worker has read N entries (or
    /// RabbitMQ deliveries), before persisting them.
    #[arg(long, value_name = "N", help_heading = "Fault injection (tests)")]
    crash_after_reads: Option<NonZeroU64>,
    /// Fault injection for tests: exit once N orders were answered 201, before the
    /// answer leaves.
    #[arg(long, value_name = "N", help_heading = "Fault injection (tests)")]
    crash_after_takes: Option<NonZeroU64>,
}

impl Cli {
    fn into_config(self) -> ServerConfig {
        let mut config = ServerConfig::new();
        config.listen = self.listen;
        config.redis = self.redis;
        config.db = self.db;
        config.queue = self.queue;
        config.user_rate = self.user_rate.get();
        config.user_burst = self.user_burst.get();
        config.worker.claim_idle = Duration::from_millis(self.claim_idle_ms.get());
        config.worker.crash_after_reads = self.crash_after_reads.map(NonZeroU64::get);
        config.crash_after_takes = self.crash_after_takes.map(NonZeroU64::get);
        config.allow_volatile_redis = self.allow_volatile_redis;
        config.floor = self.floor;
        config.batching = !self.no_batching;
        config
    }
}

#[tokio::main]
async fn main() {
    let config = Cli::parse().into_config();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = async {
        let running = server::start(config).await?;
        println!("seckill-server listening on http://{}", running.addr);
        running.until(shutdown_signal()).await
    }
    .await;
    if let Err(e) = result {
        eprintln!("seckill-server: {e}");
        std::process::exit(1);
    }
}
