//! Starting `seckill-server` processes (for the load generator, the tests and the
//! benchmark).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Errors of this module and of the load generator.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a starting instance gets to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The `seckill-server` binary built beside the running program (`target/<profile>/`,
/// also from a test binary in `target/<profile>/deps/`).
pub fn server_binary() -> Result<PathBuf, BoxError> {
    binary_beside(
        "seckill-server",
        " (or pass seckill-load --server-bin PATH)",
    )
}

/// The `seckill-load` binary next to the running executable (see [`server_binary`]).
pub fn load_binary() -> Result<PathBuf, BoxError> {
    binary_beside("seckill-load", "")
}

/// `name` beside the running executable; `also`: what else the error suggests.
fn binary_beside(name: &str, also: &str) -> Result<PathBuf, BoxError> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(name);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: build it with `cargo build --release -p lock-examples --bins`{also}",
            bin.display()
        )
        .into())
    }
}

/// One `seckill-server` child process on a port of its own; killed on drop.
#[derive(Debug)]
pub struct Instance {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Instance {
    /// Starts `bin` on `127.0.0.1` (a free port) against `redis` and the database `db`
    /// (its `--db`), with `extra` arguments, and waits until it listens. Its log goes to this
    /// process's stderr (`RUST_LOG`, default `warn`).
    pub async fn spawn(
        bin: &Path,
        redis: &str,
        db: impl AsRef<std::ffi::OsStr>,
        extra: &[&str],
    ) -> Result<Instance, BoxError> {
        Self::spawn_under(None, bin, redis, db, extra).await
    }

    /// [`Instance::spawn`], with `wrapper` (a program and its arguments, such as
    /// `valgrind --tool=callgrind ...`) running `bin` and its arguments when given.
    pub async fn spawn_under(
        wrapper: Option<(&Path, &[String])>,
        bin: &Path,
        redis: &str,
        db: impl AsRef<std::ffi::OsStr>,
        extra: &[&str],
    ) -> Result<Instance, BoxError> {
        let mut cmd = match wrapper {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(bin);
                cmd
            }
            None => Command::new(bin),
        };
        cmd.args(["--listen", "127.0.0.1:0", "--redis", redis, "--db"])
            .arg(db)
            .args(extra)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            );
        let (child, url) = spawn_listening(cmd, bin).await?;
        Ok(Instance { child, url })
    }

    /// Stops the process the way an operator does, SIGTERM (a graceful shutdown), and
    /// waits at most `limit` for it to exit; an error if it does not, or exits with a
    /// failure. SIGTERM is sent by `kill(1)`.
    pub async fn terminate(&mut self, limit: Duration) -> Result<(), BoxError> {
        let pid = self.child.id().ok_or("the instance has already exited")?;
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await
            .map_err(|e| format!("cannot run kill(1): {e}"))?;
        if !sent.success() {
            return Err(format!("kill -TERM {pid} failed: {sent}").into());
        }
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(format!("the instance exited with {status}").into()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => {
                let _ = self.child.kill().await;
                Err(format!("the instance still ran {limit:?} after SIGTERM; killed it").into())
            }
        }
    }

    /// Kills the process (SIGKILL) and waits for it.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

/// Starts `cmd` (the program `bin`) with its stdout piped and waits (at most 30 s) for
/// its first line, `... listening on URL`; the child (killed on drop) and the URL. A
/// child that prints something else or nothing is killed and reported.
pub(crate) async fn spawn_listening(
    mut cmd: Command,
    bin: &Path,
) -> Result<(Child, String), BoxError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout pipe")?;
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(START_TIMEOUT, lines.next_line()).await;
    let url = match first {
        Ok(Ok(Some(line))) => line
            .split_once("listening on ")
            .map(|(_, url)| url.trim().to_string()),
        _ => None,
    };
    let Some(url) = url else {
        let _ = child.kill().await;
        let status = child.wait().await.ok();
        return Err(format!(
            "{} did not start (exit status {status:?}); its log is above",
            bin.display()
        )
        .into());
    };
    // Keep the pipe drained so the child never blocks on a full stdout.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
