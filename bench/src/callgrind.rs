//! Counting instructions with callgrind (`valgrind --tool=callgrind`): around this
//! program's `ops` subcommand (the client side, on a native redis-server), or around a
//! redis-server of its own that a native `ops` run talks to (the server side).
//!
//! callgrind writes its counts when the program exits, so the server side ends its
//! redis-server with `SHUTDOWN NOSAVE` and waits for it, then reads the file's
//! `totals:` line (or `summary:`, its older spelling).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::measure::BoxError;

/// Longest one program may run under callgrind before the measurement gives up.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);
/// How long a redis-server under callgrind gets to answer PING, and to exit.
const SERVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Ports tried when the one picked gets taken before the server binds it.
const START_ATTEMPTS: usize = 3;

/// The total instruction count of a callgrind out file: the `totals:` line, else the
/// `summary:` line (the first number on it: the `Ir` event, the default and only one).
pub fn parse_totals(text: &str) -> Option<u64> {
    let find = |prefix: &str| {
        text.lines().find_map(|l| {
            l.strip_prefix(prefix)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
    };
    find("totals:").or_else(|| find("summary:"))
}

/// Fails with a clear message unless `valgrind` runs.
pub async fn check_valgrind() -> Result<(), BoxError> {
    let ok = Command::new("valgrind")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(
            "valgrind not found: instruction counts need it (Debian: apt-get install \
             valgrind; scripts/bench installs it), or pass --no-instructions"
                .into(),
        )
    }
}

/// A scratch directory for out files and logs, removed on drop; or, when
/// `LOCK_BENCH_CALLGRIND_DIR` names a directory, that one, kept for
/// `callgrind_annotate`.
#[derive(Debug)]
pub struct Scratch {
    dir: PathBuf,
    keep: bool,
}

impl Scratch {
    pub fn new() -> Result<Self, BoxError> {
        let (dir, keep) = match std::env::var_os("LOCK_BENCH_CALLGRIND_DIR") {
            Some(dir) if !dir.is_empty() => (PathBuf::from(dir), true),
            _ => (
                std::env::temp_dir().join(format!("lock-bench-callgrind-{}", std::process::id())),
                false,
            ),
        };
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir, keep })
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The files of one counted run named `tag`: callgrind's out file and its log.
    fn counted(&self, tag: &str) -> (PathBuf, PathBuf) {
        (
            self.file(&format!("{tag}.out")),
            self.file(&format!("{tag}.log")),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `valgrind --tool=callgrind` around `program args`, writing to `out`, its own
/// messages and the program's output into `log`.
fn callgrind(out: &Path, log: &Path, program: &Path, args: &[String]) -> Result<Command, BoxError> {
    let log = std::fs::File::create(log)?;
    let mut cmd = Command::new("valgrind");
    cmd.arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", out.display()))
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    Ok(cmd)
}

/// The last lines of `log`, for an error message.
fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

pub fn totals_of(out: &Path) -> Result<u64, BoxError> {
    let text = std::fs::read_to_string(out)
        .map_err(|e| format!("cannot read callgrind's {}: {e}", out.display()))?;
    parse_totals(&text).ok_or_else(|| format!("no totals: line in {}", out.display()).into())
}

/// Waits for `child` at most `limit`; an error (naming `what` and its log) unless it
/// exits with status 0.
async fn finished(
    child: &mut Child,
    limit: Duration,
    what: &str,
    log: &Path,
) -> Result<(), BoxError> {
    finished_with(child, limit, what, log, |_| false).await
}

/// [`finished`], also taking an exit status that `accept` takes.
async fn finished_with(
    child: &mut Child,
    limit: Duration,
    what: &str,
    log: &Path,
    accept: impl Fn(i32) -> bool,
) -> Result<(), BoxError> {
    match tokio::time::timeout(limit, child.wait()).await {
        Ok(Ok(status)) if status.success() || status.code().is_some_and(&accept) => Ok(()),
        Ok(Ok(status)) => Err(format!("{what} exited with {status}:\n{}", tail(log)).into()),
        Ok(Err(e)) => Err(format!("{what}: {e}").into()),
        Err(_) => {
            let _ = child.kill().await;
            Err(format!(
                "{what} still ran after {limit:?}; killed it:\n{}",
                tail(log)
            )
            .into())
        }
    }
}

/// Instructions callgrind counts in `program args` (run to its end), `tag` naming the
/// files in `scratch`.
pub async fn count_client(
    scratch: &Scratch,
    tag: &str,
    program: &Path,
    args: &[String],
) -> Result<u64, BoxError> {
    count_accepting(scratch, tag, program, args, |_| false).await
}

/// [`count_client`] for a program whose exit status may also be one `accept` takes
/// (a load generator that judges what it measured, against a server it knows fails).
pub async fn count_accepting(
    scratch: &Scratch,
    tag: &str,
    program: &Path,
    args: &[String],
    accept: impl Fn(i32) -> bool,
) -> Result<u64, BoxError> {
    let (out, log) = scratch.counted(tag);
    let mut child = callgrind(&out, &log, program, args)?.spawn()?;
    let what = format!("callgrind {tag}");
    finished_with(&mut child, RUN_TIMEOUT, &what, &log, accept).await?;
    totals_of(&out)
}

/// Instructions callgrind counts in a redis-server of its own while `program args
/// --redis <url>` runs natively against it, from start to `SHUTDOWN NOSAVE`.
pub async fn count_server(
    scratch: &Scratch,
    tag: &str,
    program: &Path,
    args: &[String],
) -> Result<u64, BoxError> {
    let server = CountedRedis::start(scratch, tag).await?;
    let client_log = scratch.file(&format!("{tag}.client.log"));
    let output = std::fs::File::create(&client_log)?;
    let mut client = Command::new(program)
        .args(args)
        .arg("--redis")
        .arg(server.url())
        .stdin(Stdio::null())
        .stdout(output.try_clone()?)
        .stderr(output)
        .kill_on_drop(true)
        .spawn()?;
    finished(
        &mut client,
        RUN_TIMEOUT,
        &format!("{tag} client"),
        &client_log,
    )
    .await?;
    server.finish().await
}

/// A redis-server under callgrind, answering PING; [`CountedRedis::finish`] ends it
/// and reads its count. Killed on drop.
#[derive(Debug)]
pub struct CountedRedis {
    child: Child,
    port: u16,
    tag: String,
    out: PathBuf,
    log: PathBuf,
}

impl CountedRedis {
    /// Starts one on a free port, `tag` naming its files in `scratch`.
    pub async fn start(scratch: &Scratch, tag: &str) -> Result<Self, BoxError> {
        let (out, log) = scratch.counted(tag);
        let (child, port) = start_server(scratch, &out, &log).await?;
        Ok(Self {
            child,
            port,
            tag: tag.to_string(),
            out,
            log,
        })
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Ends the server (`SHUTDOWN NOSAVE`), waits for callgrind to write its file, and
    /// returns the instructions counted from start to end.
    pub async fn finish(mut self) -> Result<u64, BoxError> {
        // The reply never comes: the server closes the connection as it exits.
        send(self.port, b"SHUTDOWN NOSAVE\r\n").await?;
        finished(
            &mut self.child,
            SERVER_TIMEOUT,
            &format!("callgrind {}", self.tag),
            &self.log,
        )
        .await?;
        totals_of(&self.out)
    }
}

/// valgrind's arguments to count a program's instructions into `<tag>.out` in
/// `scratch`, its own messages going to `<tag>.log` (the program's output stays its
/// own), and the out file: for a program started by someone else, such as a
/// `seckill-server` instance.
pub fn wrapper(scratch: &Scratch, tag: &str) -> (Vec<String>, PathBuf) {
    let (out, log) = scratch.counted(tag);
    let args = vec![
        "--tool=callgrind".to_string(),
        format!("--callgrind-out-file={}", out.display()),
        format!("--log-file={}", log.display()),
    ];
    (args, out)
}

/// `$REDIS_SERVER_BIN`, or `redis-server` from PATH (as the test harness).
fn redis_server_bin() -> PathBuf {
    std::env::var_os("REDIS_SERVER_BIN").map_or_else(|| "redis-server".into(), PathBuf::from)
}

/// A redis-server under callgrind on a free port, answering PING.
async fn start_server(scratch: &Scratch, out: &Path, log: &Path) -> Result<(Child, u16), BoxError> {
    let mut last = String::new();
    for _ in 0..START_ATTEMPTS {
        let port = lock_tests::free_port();
        let args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--dir",
            &scratch.dir.display().to_string(),
            "--logfile",
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut child = callgrind(out, log, &redis_server_bin(), &args)?.spawn()?;
        let deadline = Instant::now() + SERVER_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                last = format!(
                    "redis-server under callgrind exited with {status}:\n{}",
                    tail(log)
                );
                break;
            }
            if send(port, b"PING\r\n")
                .await
                .is_ok_and(|r| r.starts_with("+PONG"))
            {
                return Ok((child, port));
            }
            if Instant::now() >= deadline {
                let _ = child.kill().await;
                return Err(format!(
                    "redis-server under callgrind did not answer PING within {SERVER_TIMEOUT:?}:\n{}",
                    tail(log)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Err(last.into())
}

/// Sends one inline command to `127.0.0.1:port` and returns what comes back before the
/// server answers or closes the connection (empty when it closes first).
async fn send(port: u16, command: &[u8]) -> Result<String, BoxError> {
    let io = async {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(command).await?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).await.unwrap_or(0);
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    Ok(tokio::time::timeout(Duration::from_secs(5), io).await??)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_line() {
        let out = "version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: 1234\n\
                   fn=main\n1 2\ntotals: 98765432\n";
        assert_eq!(parse_totals(out), Some(98_765_432));
        assert_eq!(parse_totals("events: Ir\nsummary: 42\n"), Some(42));
        assert_eq!(parse_totals("events: Ir\ntotals: nope\n"), None);
        assert_eq!(parse_totals(""), None);
    }
}
