//! What the small example programs share: where their store is, where they listen, and
//! starting one as a child process from a test.
//!
//! Every small program (`cache-lock-axum`, `payments`, `rate-limited-api`) takes
//! `--listen ADDR` (default `127.0.0.1:3000`; port 0 picks a free one) and `--redis URL`
//! (else `REDIS_URL`, else `redis://127.0.0.1:6379/`), prints
//! `<name> listening on http://ADDR` once it accepts requests, and stops on SIGINT or
//! SIGTERM.

use std::net::SocketAddr;
use std::path::Path;

use clap::{Args, FromArgMatches};

use tokio::process::{Child, Command};

use crate::seckill::instances::{BoxError, shutdown_signal, spawn_listening};

/// The command line every small program shares.
#[derive(Debug, clap::Args)]
pub struct ProgramArgs {
    /// Address to listen on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// The Redis to use.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    pub redis: String,
}

impl ProgramArgs {
    /// Parses the command line of program `name` (`about` heads its `--help`); a bad
    /// command line exits with clap's message and status 2, `--help` with 0.
    pub fn parse(name: &'static str, about: &'static str) -> Self {
        let command = Self::augment_args(clap::Command::new(name)).about(about);
        Self::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit())
    }
}

/// Serves `router` on `addr` until SIGINT or SIGTERM, after printing
/// `<name> listening on http://ADDR`.
pub async fn serve(name: &str, addr: SocketAddr, router: axum::Router) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    println!("{name} listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown_signal())
    .await?;
    Ok(())
}

/// Runs a program's `main` body: its error goes to stderr with the program's name and
/// exit status 1.
pub fn exit_on_error(name: &str, result: Result<(), BoxError>) {
    if let Err(e) = result {
        eprintln!("{name}: {e}");
        std::process::exit(1);
    }
}

/// A program started by a test; killed on drop.
#[derive(Debug)]
pub struct Running {
    _child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

/// Starts `bin` with `args` and `REDIS_URL=redis`, listening on a free port, and waits
/// (at most 30 s) for its `listening on` line.
pub async fn start(bin: &Path, redis: &str, args: &[&str]) -> Result<Running, BoxError> {
    let mut cmd = Command::new(bin);
    cmd.args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("REDIS_URL", redis);
    let (child, url) = spawn_listening(cmd, bin).await?;
    Ok(Running { _child: child, url })
}
