//! Two processes contending for one lock.
//!
//! `cargo run -p lock-examples --bin lock-demo` starts a throwaway `redis-server` (or
//! uses `REDIS_URL`), then runs two copies of itself as separate OS processes. Each takes
//! the lock `demo:printer` five times, "prints a page" for 200 ms while holding it, and
//! releases it. The output shows the two processes taking turns, the fencing token
//! growing with every grant, and a `try_lock` bouncing off the held lock.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lock_core::{LockClient, LockConfig, LockError};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("worker") if args.len() == 4 => worker(&args[2], &args[3]).await,
        None => parent().await,
        _ => Err("usage: lock-demo [worker URL NAME]".into()),
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
                    g.fencing_token()
                );
                g.release().await?;
            }
            Err(e) if e.is_busy() => println!("[{name}] try_lock: busy, so wait for it"),
            Err(e) => return Err(e.into()),
        }
        let started = Instant::now();
        let guard = client.lock(("demo", "printer")).await?;
        println!(
            "[{name}] page {page}: got the lock after {:>4} ms, fencing token {}",
            started.elapsed().as_millis(),
            guard.fencing_token()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        guard.release().await?;
        println!("[{name}] page {page}: released");
    }
    Ok(())
}

async fn parent() -> Res {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let (url, server) = start_redis().await?;
            (url, Some(server))
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

/// A redis-server child process, killed on drop.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_redis() -> Result<(String, Server), Box<dyn std::error::Error>> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let bin = std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(&bin)
        .args([
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start {bin}: {e}; install redis-server or set REDIS_URL"))?;
    let server = Server(child);
    let url = format!("redis://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match LockClient::open(url.as_str()).await {
            Ok(_) => return Ok((url, server)),
            Err(e) if Instant::now() > deadline => {
                return Err(format!("redis-server did not come up: {e}").into());
            }
            Err(LockError::Redis(_)) | Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
        }
    }
}
