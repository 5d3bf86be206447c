//! One program, any store: the lock's store is chosen by the URL (`AnyLocks::open`).
//!
//! ```text
//! cargo run -p lock-examples --bin lock-by-url -- redis://127.0.0.1:6379/
//! cargo run -p lock-examples --bin lock-by-url -- postgres://user:pw@127.0.0.1/app
//! cargo run -p lock-examples --bin lock-by-url -- mysql://user:pw@127.0.0.1/app
//! cargo run -p lock-examples --bin lock-by-url -- zk://127.0.0.1:2181/locks
//! cargo run -p lock-examples --bin lock-by-url -- memory://
//! ```
//!
//! Takes the lock `nightly-report`, shows that a second take is refused while it is
//! held, and releases it.

use clap::Parser;
use lock_core::{AnyLocks, DistributedLock, HeldLock, LockConfig};

/// Takes the lock `nightly-report` on the store a URL names, shows a second take
/// refused while it is held, and releases it.
#[derive(Debug, Parser)]
struct Cli {
    /// The store: redis://, redis+cluster://, redlock://, memory://, postgres://,
    /// mysql:// or zk://.
    url: String,
}

type Res = Result<(), Box<dyn std::error::Error + Send + Sync>>;

async fn run(url: &str) -> Res {
    let locks = AnyLocks::open(url, LockConfig::new()).await?;
    let guard = locks.lock_named("nightly-report").await?;
    let token = guard.fence().await?;
    println!(
        "holding {} (fencing token {})",
        guard.name(),
        token.map_or("none".into(), |t| t.to_string())
    );
    // Another scope (another task, process or host) is refused while it is held.
    let other = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock_named("nightly-report").await.map(|_| ()) }
    });
    match other.await? {
        Err(e) if e.is_busy() => println!("a second holder is refused: {e}"),
        Err(e) => return Err(e.into()),
        Ok(()) => return Err("a second holder got the lock".into()),
    }
    guard.release().await?;
    println!("released");
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(&cli.url).await {
        eprintln!("lock-by-url: {e}");
        std::process::exit(1);
    }
}
