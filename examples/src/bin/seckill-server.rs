//! `seckill-server`: the flash-sale service (see `lock_examples::seckill`).
//!
//! ```text
//! seckill-server [--listen ADDR] [--redis URL] [--db PATH]
//!                [--user-rate N] [--user-burst N] [--claim-idle-ms N]
//!                [--crash-after-reads N] [--crash-after-takes N]
//!                [--allow-volatile-redis] [--floor] [--no-batching]
//! ```
//!
//! Prints `seckill-server listening on http://ADDR` on stdout once it accepts requests
//! (with `--listen 127.0.0.1:0` the port is picked by the OS); logs go to stderr
//! (`RUST_LOG`, default `info`). SIGINT or SIGTERM stop it gracefully.

use std::time::Duration;

use lock_examples::seckill::instances::shutdown_signal;
use lock_examples::seckill::server::{self, ServerConfig};

const USAGE: &str = "usage: seckill-server [--listen ADDR] [--redis URL] [--db PATH]
                      [--user-rate N] [--user-burst N] [--claim-idle-ms N]
                      [--crash-after-reads N] [--crash-after-takes N]
                      [--allow-volatile-redis] [--floor] [--no-batching]
  --listen ADDR          address to listen on (default 127.0.0.1:8080; port 0: any free port)
  --redis URL            the Redis shared by every instance (default redis://127.0.0.1:6379/)
  --db PATH              the SQLite file shared by every instance (default seckill.db)
  --user-rate N          orders per second per user, on average (default 2)
  --user-burst N         orders per user at once (default 4)
  --claim-idle-ms N      pending stream entries idle this long are claimed (default 5000)
  --crash-after-reads N  fault injection: exit once the worker has read N entries,
                         before persisting them
  --crash-after-takes N  fault injection: exit once N units were taken, before answering
  --allow-volatile-redis start even if Redis does not persist (AOF off); by default the
                         server refuses, since Redis holds accepted orders until the
                         worker writes them
  --floor                the benchmark's floor: orders run the stock script alone (no
                         lock, idempotency key or rate limit); never in production
  --no-batching          send every lock, rate-limit and idempotency call on its own
                         instead of coalescing concurrent ones (LockConfig::with_batching)";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn parse_args() -> Result<ServerConfig, BoxError> {
    let mut config = ServerConfig::new();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if arg == "--allow-volatile-redis" {
            config.allow_volatile_redis = true;
            continue;
        }
        if arg == "--floor" {
            config.floor = true;
            continue;
        }
        if arg == "--no-batching" {
            config.batching = false;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| format!("{arg} needs a value (see --help)"))?;
        let number = |v: &str| -> Result<u64, BoxError> {
            v.parse::<u64>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| format!("{arg}: expected a whole number >= 1, got {v:?}").into())
        };
        match arg.as_str() {
            "--listen" => {
                config.listen = value
                    .parse()
                    .map_err(|e| format!("--listen: expected IP:PORT, got {value:?}: {e}"))?
            }
            "--redis" => config.redis = value,
            "--db" => config.db = value.into(),
            "--user-rate" => config.user_rate = u32::try_from(number(&value)?)?,
            "--user-burst" => config.user_burst = u32::try_from(number(&value)?)?,
            "--claim-idle-ms" => config.worker.claim_idle = Duration::from_millis(number(&value)?),
            "--crash-after-reads" => config.worker.crash_after_reads = Some(number(&value)?),
            "--crash-after-takes" => config.crash_after_takes = Some(number(&value)?),
            other => return Err(format!("unknown option {other:?} (see --help)").into()),
        }
    }
    Ok(config)
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = async {
        let config = parse_args()?;
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
