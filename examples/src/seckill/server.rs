//! The service: configuration and start-up (connections, the queue's consumer, the
//! router).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use lock_core::ids::{IdConfig, IdMode};
use lock_core::{IdGenerator, LockClient, LockConfig, RateLimit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::watch;

use super::app::App;
use super::order::{self, CLAIM_LEASE};
use super::queue::OrderQueue;
use super::queue::rabbit::{RabbitConfig, RabbitQueue};
use super::queue::stream::{StreamQueue, WorkerConfig};
use super::routes;
use super::store;

/// Time limit of every Redis call on the request path.
const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// What `seckill-server` is started with. Every field has a default (see
/// [`ServerConfig::new`]).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (default `127.0.0.1:8080`; port 0 picks a free one).
    pub listen: SocketAddr,
    /// The Redis shared by all instances (default `redis://127.0.0.1:6379/`).
    pub redis: String,
    /// The orders database shared by all instances: a SQLite file on this machine
    /// (default `seckill.db`), or `mysql://...` (MySQL or MariaDB).
    pub db: String,
    /// The queue between the order path and the database: `stream` (the Redis Stream,
    /// the default) or `amqp://...` (RabbitMQ).
    pub queue: String,
    /// Orders per second one user may send, on average (default 2).
    pub user_rate: u32,
    /// How many orders one user may send at once (default 4).
    pub user_burst: u32,
    /// The stream worker's settings.
    pub worker: WorkerConfig,
    /// Fault injection for tests: exit once this many orders were answered 201, before
    /// the answer leaves the handler (a layer around it, see `fault.rs`). Default: never.
    pub crash_after_takes: Option<u64>,
    /// Start even if Redis does not persist (no AOF): Redis is the only record of an
    /// accepted order until the worker writes it, so by default the server refuses.
    pub allow_volatile_redis: bool,
    /// Serve the floor of `scripts/bench seckill`: orders without their protections
    /// (no lock, idempotency key or rate limit), to price them. Never in production.
    pub floor: bool,
    /// Coalesce the service's concurrent lock, rate-limit and idempotency calls into
    /// batched script calls (lock-core's default); off for `scripts/bench seckill`'s
    /// comparison.
    pub batching: bool,
}

impl ServerConfig {
    /// Every default; the worker's consumer name is unique to this process.
    pub fn new() -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            redis: "redis://127.0.0.1:6379/".into(),
            db: "seckill.db".into(),
            queue: "stream".into(),
            user_rate: 2,
            user_burst: 4,
            worker: WorkerConfig::new(format!("worker-{}-{nanos:08x}", std::process::id())),
            crash_after_takes: None,
            allow_volatile_redis: false,
            floor: false,
            batching: true,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Histogram buckets of lock-core's timings (seconds): from a local round trip to the
/// watchdog lease.
const BUCKETS: &[f64] = &[
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The process's Prometheus recorder, installed by the first instance started in it
/// (lock-core's metrics go to it); `None` if the process had a recorder already.
fn prometheus() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let installed = PrometheusBuilder::new()
                .set_buckets(BUCKETS)
                .and_then(PrometheusBuilder::install_recorder);
            match installed {
                Ok(handle) => {
                    lock_core::metrics::describe();
                    Some(handle)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "metrics are not exported: no Prometheus recorder");
                    None
                }
            }
        })
        .clone()
}

async fn connection(
    client: &redis::Client,
    response_timeout: Duration,
) -> Result<ConnectionManager, redis::RedisError> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(REDIS_TIMEOUT))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_secs(1));
    ConnectionManager::new_with_config(client.clone(), config).await
}

/// Checks that Redis persists every write: `Err` with what to do when AOF is off. A
/// `appendfsync` other than `always` (which can lose the last second of orders on a
/// crash) is only logged; so is a Redis whose `CONFIG` is disabled.
async fn check_persistence(
    conn: &mut ConnectionManager,
    url: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let info: String = redis::cmd("INFO")
        .arg("persistence")
        .query_async(conn)
        .await?;
    let aof = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("aof_enabled:"))
        .unwrap_or("0");
    if aof != "1" {
        return Err(format!(
            "Redis at {url} does not persist (aof_enabled:{aof}): until the worker writes \
             them, accepted orders live only in Redis, and a restart would lose them. Run \
             it with `--appendonly yes --appendfsync always`, or pass --allow-volatile-redis"
        )
        .into());
    }
    let fsync: Result<Vec<String>, _> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .query_async(conn)
        .await;
    match fsync.as_deref() {
        Ok([_, policy]) if policy == "always" => {}
        Ok([_, policy]) => tracing::warn!(
            policy,
            "Redis appendfsync is not `always`: a Redis crash can lose the last orders answered 201"
        ),
        _ => tracing::warn!("cannot read Redis appendfsync (CONFIG disabled?); assuming it is set"),
    }
    Ok(())
}

/// A running instance: its address, and the handle that stops it.
#[derive(Debug)]
pub struct Running {
    /// The address it listens on.
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    serve: tokio::task::JoinHandle<std::io::Result<()>>,
    worker: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops accepting requests, lets those in flight finish, stops the worker after its
    /// current batch, and waits for both.
    pub async fn stop(self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let _ = self.shutdown.send(true);
        self.serve.await??;
        self.worker.await?;
        Ok(())
    }

    /// Waits until the server stops by itself (an I/O error) or `signal` resolves, then
    /// stops it.
    pub async fn until(
        self,
        signal: impl Future<Output = ()>,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        signal.await;
        tracing::info!("shutting down");
        self.stop().await
    }
}

/// Connects to Redis and the database, starts the queue's consumer and the HTTP server.
pub async fn start(
    config: ServerConfig,
) -> Result<Running, Box<dyn std::error::Error + Send + Sync>> {
    let client = redis::Client::open(config.redis.as_str())
        .map_err(|e| format!("--redis {:?}: {e}", config.redis))?;
    let unreachable = |e: redis::RedisError| {
        format!(
            "cannot reach Redis at {}: {e} (start redis-server, or pass --redis URL)",
            config.redis
        )
    };
    let redis = connection(&client, REDIS_TIMEOUT)
        .await
        .map_err(unreachable)?;
    if !config.allow_volatile_redis {
        check_persistence(&mut redis.clone(), &config.redis).await?;
    }
    order::load_stock_script(&mut redis.clone())
        .await
        .map_err(unreachable)?;
    let worker_conn = connection(&client, Duration::from_secs(3))
        .await
        .map_err(unreachable)?;
    let locks = LockClient::from_client(
        client.clone(),
        LockConfig::new()
            .with_command_timeout(REDIS_TIMEOUT)
            .with_watchdog_lease(CLAIM_LEASE)
            .with_batching(config.batching),
    )
    .await?;
    let ids = IdGenerator::new(
        &locks,
        "seckill-order",
        IdConfig::new().with_mode(IdMode::Segment { block: 1_000 }),
    )?;
    let store = store::open(&config.db)
        .await
        .map_err(|e| format!("cannot open the database {}: {e}", config.db))?;
    let queue: Arc<dyn OrderQueue> = if config.queue.starts_with("amqp://") {
        let mut rabbit = RabbitConfig::new(config.queue.as_str(), config.worker.consumer.as_str());
        rabbit.crash_after_reads = config.worker.crash_after_reads;
        Arc::new(
            RabbitQueue::connect(rabbit, redis.clone())
                .await
                .map_err(|e| format!("cannot reach RabbitMQ at {}: {e}", config.queue))?,
        )
    } else if config.queue == "stream" {
        Arc::new(
            StreamQueue::new(redis.clone(), worker_conn, config.worker.clone())
                .await
                .map_err(unreachable)?,
        )
    } else {
        return Err(format!(
            "--queue {:?}: expected `stream` or an amqp:// URL",
            config.queue
        )
        .into());
    };
    let limiter = locks.rate_limiter(
        "seckill-orders",
        RateLimit::per_second(config.user_rate).with_burst(config.user_burst),
    );
    let idempotency = locks.idempotency_store("seckill-orders");
    let app = App {
        locks,
        redis,
        ids,
        store: store.clone(),
        queue: queue.clone(),
        metrics: prometheus(),
    };
    let upkeep = app.metrics.clone();
    let router: Router = if config.floor {
        tracing::warn!("--floor: orders run without their lock, idempotency key and rate limit");
        routes::floor_router(app, config.crash_after_takes)
    } else {
        routes::router(app, limiter, idempotency, config.crash_after_takes)
    };

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    let (shutdown, rx) = watch::channel(false);
    let worker = tokio::spawn(queue.consume(store, rx.clone()));
    if let Some(handle) = upkeep {
        // Histogram samples wait in the recorder until upkeep folds them in.
        let mut stop = rx.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(Duration::from_secs(5)) => handle.run_upkeep(),
                }
            }
        });
    }
    let mut stop = rx;
    let serve = tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
    });
    Ok(Running {
        addr,
        shutdown,
        serve,
        worker,
    })
}
