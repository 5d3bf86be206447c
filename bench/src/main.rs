//! `scripts/bench lock`: lock-core against the floor (the same work as raw Redis
//! commands on one multiplexed connection) and against the `rslock` crate, in one run,
//! on a redis-server this program starts itself.
//!
//! Prints one line per figure and `ratio <name> <value>` per comparison.
//! Options: `--seconds N` per measurement (default 2).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lock_core::{Lease, LockClient, LockConfig, LockOptions};
use lock_tests::RedisServer;
use redis::aio::ConnectionManager;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seconds = args
        .iter()
        .position(|a| a == "--seconds")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.parse::<f64>())
        .transpose()?
        .unwrap_or(2.0);
    let what = args.first().map(String::as_str).unwrap_or("lock");
    if what != "lock" {
        return Err(format!("unknown benchmark {what:?}; available: lock").into());
    }
    let server = RedisServer::start();
    let url = server.url();
    println!("bench lock: redis-server at {url}, {seconds} s per measurement");
    let d = Duration::from_secs_f64(seconds);
    uncontended(&url, d).await?;
    hot_key(&url, d).await?;
    Ok(())
}

/// Seconds of CPU the redis-server has used (user + system), from INFO CPU.
async fn server_cpu(conn: &mut ConnectionManager) -> Result<f64, BoxError> {
    let info: String = redis::cmd("INFO").arg("CPU").query_async(conn).await?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| {
                l.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_user") + field("used_cpu_sys"))
}

/// This process's CPU seconds (user + system), from /proc/self/stat.
fn own_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// Runs `tasks` copies of `cycle(task, n)` until `d` passes; returns cycles per second
/// and prints the CPU microseconds per cycle spent by redis-server and by this process.
async fn rate<F, Fut>(
    name: &str,
    conn: &mut ConnectionManager,
    tasks: usize,
    d: Duration,
    cycle: F,
) -> Result<f64, BoxError>
where
    F: Fn(usize, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send,
{
    // Warm-up: connections, script cache, allocator.
    let warm = Instant::now() + d / 5;
    let run = |until: Instant| {
        let mut handles = Vec::new();
        for t in 0..tasks {
            let cycle = cycle.clone();
            handles.push(tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < until {
                    cycle(t, n).await?;
                    n += 1;
                }
                Ok::<u64, BoxError>(n)
            }));
        }
        handles
    };
    for h in run(warm) {
        h.await??;
    }
    let (server_before, own_before) = (server_cpu(conn).await?, own_cpu());
    let start = Instant::now();
    let mut total = 0;
    for h in run(start + d) {
        total += h.await??;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let per = |cpu: f64| cpu * 1e6 / total.max(1) as f64;
    println!(
        "uncontended tasks={tasks} {name}_cpu_us_per_cycle redis {:.1} client {:.1}",
        per(server_cpu(conn).await? - server_before),
        per(own_cpu() - own_before)
    );
    Ok(total as f64 / elapsed)
}

fn lua_source(name: &str) -> Result<&'static str, BoxError> {
    lock_core::SCRIPT_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .ok_or_else(|| format!("no script {name}").into())
}

const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0"#;

async fn uncontended(url: &str, d: Duration) -> Result<(), BoxError> {
    let client = LockClient::open(url).await?;
    let conn = ConnectionManager::new(redis::Client::open(url)?).await?;
    let script = Arc::new(redis::Script::new(COMPARE_AND_DELETE));
    let rslock = rslock::LockManager::new(vec![url.to_string()]);
    let fixed = LockOptions::new()
        .lease(Lease::Fixed(Duration::from_secs(10)))
        .wait(Duration::ZERO);
    for tasks in [1usize, 64] {
        let mut probe = conn.clone();
        let floor = rate("floor", &mut probe, tasks, d, {
            let (conn, script) = (conn.clone(), script.clone());
            move |t, n| {
                let (mut conn, script) = (conn.clone(), script.clone());
                async move {
                    let key = format!("bench:floor:{t}");
                    let token = format!("{t}:{n}");
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(&key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(10_000)
                        .query_async(&mut conn)
                        .await?;
                    ok.ok_or("floor: key was taken")?;
                    let _: i64 = script.key(&key).arg(&token).invoke_async(&mut conn).await?;
                    Ok(())
                }
            }
        })
        .await?;
        // The floor for our semantics: lock-core's own scripts issued raw, so the gap to
        // `ours` is the library's overhead and the gap to `floor` is the scripts' cost.
        let acquire = Arc::new(redis::Script::new(lua_source("acquire.lua")?));
        let release = Arc::new(redis::Script::new(lua_source("release.lua")?));
        let raw_scripts = rate("our_scripts_raw", &mut probe, tasks, d, {
            let (conn, acquire, release) = (conn.clone(), acquire.clone(), release.clone());
            move |t, n| {
                let (mut conn, acquire, release) = (conn.clone(), acquire.clone(), release.clone());
                async move {
                    let key = format!("lock:{{bench:raw:{t}}}");
                    let owner = format!("0123456789abcdef0123456789abcdef:{n}");
                    let granted: Vec<i64> = acquire
                        .key(&key)
                        .key(format!("{key}:fence"))
                        .arg(&owner)
                        .arg(10_000)
                        .invoke_async(&mut conn)
                        .await?;
                    if granted.first() != Some(&1) {
                        return Err("raw scripts: lock was taken".into());
                    }
                    let _: i64 = release
                        .key(&key)
                        .key(format!("{key}:released"))
                        .arg(&owner)
                        .arg(10_000)
                        .arg("1")
                        .arg("x")
                        .invoke_async(&mut conn)
                        .await?;
                    Ok(())
                }
            }
        })
        .await?;
        println!(
            "ratio our_scripts_raw_vs_floor_{tasks}_tasks {:.2}",
            raw_scripts / floor
        );
        let ours = rate("ours", &mut probe, tasks, d, {
            let (client, fixed) = (client.clone(), fixed.clone());
            move |t, _| {
                let (client, fixed) = (client.clone(), fixed.clone());
                async move {
                    let g = client.acquire(("bench", "ours", t), fixed).await?;
                    g.release().await?;
                    Ok(())
                }
            }
        })
        .await?;
        let ours_watchdog = rate("ours_watchdog", &mut probe, tasks, d, {
            let client = client.clone();
            move |t, _| {
                let client = client.clone();
                async move {
                    let g = client.try_lock(("bench", "watchdog", t)).await?;
                    g.release().await?;
                    Ok(())
                }
            }
        })
        .await?;
        let peer = rate("rslock", &mut probe, tasks, d, {
            let rslock = rslock.clone();
            move |t, _| {
                let rslock = rslock.clone();
                async move {
                    let key = format!("bench:rslock:{t}");
                    let lock = rslock
                        .lock(key.as_bytes(), Duration::from_secs(10))
                        .await
                        .map_err(|e| format!("rslock: {e:?}"))?;
                    rslock.unlock(&lock).await;
                    Ok(())
                }
            }
        })
        .await?;
        println!("uncontended tasks={tasks} floor_cycles_per_s {floor:.0}");
        println!("uncontended tasks={tasks} ours_fixed_lease_cycles_per_s {ours:.0}");
        println!("uncontended tasks={tasks} ours_watchdog_cycles_per_s {ours_watchdog:.0}");
        println!("uncontended tasks={tasks} rslock_cycles_per_s {peer:.0}");
        println!("ratio ours_vs_floor_{tasks}_tasks {:.2}", ours / floor);
        println!(
            "ratio ours_vs_our_scripts_raw_{tasks}_tasks {:.2}",
            ours / raw_scripts
        );
        println!(
            "ratio ours_watchdog_vs_floor_{tasks}_tasks {:.2}",
            ours_watchdog / floor
        );
        println!("ratio ours_vs_rslock_{tasks}_tasks {:.2}", ours / peer);
    }
    Ok(())
}

/// Handoff statistics on one contended key.
#[derive(Default)]
struct Handoffs {
    last_release: Mutex<Option<Instant>>,
    latencies_us: Mutex<Vec<u64>>,
    grants: AtomicU64,
}

impl Handoffs {
    fn granted(&self) {
        self.grants.fetch_add(1, Ordering::Relaxed);
        if let Some(at) = self.last_release.lock().unwrap().take() {
            let us = at.elapsed().as_micros() as u64;
            self.latencies_us.lock().unwrap().push(us);
        }
    }

    fn releasing(&self) {
        *self.last_release.lock().unwrap() = Some(Instant::now());
    }

    fn report(&self, name: &str, elapsed: Duration) -> f64 {
        let mut l = self.latencies_us.lock().unwrap().clone();
        l.sort_unstable();
        let pct = |p: f64| {
            l.get(((l.len() as f64 - 1.0) * p) as usize)
                .copied()
                .unwrap_or(0)
        };
        let rate = self.grants.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64();
        println!("hot_key {name} handoffs_per_s {rate:.0}");
        println!(
            "hot_key {name} handoff_p50_us {} handoff_p99_us {}",
            pct(0.5),
            pct(0.99)
        );
        rate
    }
}

/// 64 tasks on one key; `clients` LockClients share them (more than one client means
/// some handoffs cross the pub/sub connection instead of the in-process wake-up).
async fn hot_ours(url: &str, d: Duration, clients: usize) -> Result<f64, BoxError> {
    let stats = Arc::new(Handoffs::default());
    let mut pool = Vec::new();
    for _ in 0..clients {
        pool.push(LockClient::open_with_config(url, LockConfig::new()).await?);
    }
    let until = Instant::now() + d;
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..64 {
        let (client, stats) = (pool[t % clients].clone(), stats.clone());
        handles.push(tokio::spawn(async move {
            let opts = LockOptions::new()
                .wait(Duration::from_secs(30))
                .lease(Lease::Fixed(Duration::from_secs(10)));
            while Instant::now() < until {
                let g = client
                    .acquire(("bench", "hot", clients), opts.clone())
                    .await?;
                stats.granted();
                stats.releasing();
                g.release().await?;
            }
            Ok::<(), BoxError>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(stats.report(&format!("ours_{clients}_clients"), start.elapsed()))
}

async fn hot_key(url: &str, d: Duration) -> Result<(), BoxError> {
    let ours_one = hot_ours(url, d, 1).await?;
    let ours_four = hot_ours(url, d, 4).await?;
    let stats = Arc::new(Handoffs::default());
    let rslock = rslock::LockManager::new(vec![url.to_string()]);
    let until = Instant::now() + d;
    let start = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..64 {
        let (rslock, stats) = (rslock.clone(), stats.clone());
        handles.push(tokio::spawn(async move {
            while Instant::now() < until {
                let lock = rslock
                    .acquire_no_guard(&b"bench:rslock:hot"[..], Duration::from_secs(10))
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?;
                stats.granted();
                stats.releasing();
                rslock.unlock(&lock).await;
            }
            Ok::<(), BoxError>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let peer = stats.report("rslock", start.elapsed());
    println!(
        "ratio hot_handoffs_ours_1_client_vs_rslock {:.2}",
        ours_one / peer
    );
    println!(
        "ratio hot_handoffs_ours_4_clients_vs_rslock {:.2}",
        ours_four / peer
    );
    Ok(())
}
