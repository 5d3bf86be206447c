//! [`RedisServer`]: one private `redis-server` process per test.

use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::port::{bindable, free_port};
use crate::process::{TempDir, await_stopped, signal, spawn};

/// How long a freshly spawned server gets to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::restart`] waits for its port to become free again.
const RESTART_TIMEOUT: Duration = Duration::from_secs(15);
/// Fresh ports tried by [`RedisServer::start`] when the chosen one gets taken.
const START_ATTEMPTS: usize = 5;
const LOG_FILE: &str = "redis.log";
const STDIO_FILE: &str = "stdio.log";

/// A `redis-server` child process on its own `127.0.0.1` port and temp dir.
///
/// Dropping it kills the process, prints the server log to stderr if the
/// thread is panicking (i.e. the test failed), and removes the directory.
#[derive(Debug)]
pub struct RedisServer {
    bin: OsString,
    args: Vec<String>,
    port: u16,
    pid: u32,
    child: Option<Child>,
    paused: AtomicBool,
    // Declared last: removed after `Drop::drop` has killed the process.
    dir: TempDir,
}

enum LaunchError {
    /// The server could not listen on its port: another socket has it.
    PortInUse,
    /// Anything else, with a human-readable reason.
    Failed(String),
}

impl RedisServer {
    /// Starts `redis-server` (or `$REDIS_SERVER_BIN`) on a free port with
    /// persistence off, and waits until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If the binary is missing or the server does not come up within ~10 s
    /// (the message then includes the server's log).
    pub fn start() -> RedisServer {
        Self::start_with_args(&[])
    }

    /// Like [`start`](Self::start), with extra command-line arguments, e.g.
    /// `["--maxmemory", "10mb"]`. They come after the harness's own
    /// (`--port`, `--bind`, `--dir`, `--logfile`, `--save ""`,
    /// `--appendonly no`), so they can override the persistence settings;
    /// do not override `--port`, `--bind`, `--dir` or `--logfile`.
    pub fn start_with_args(args: &[&str]) -> RedisServer {
        Self::start_with(default_bin(), args)
    }

    /// Like [`start_with_args`](Self::start_with_args) with an explicit
    /// binary instead of `$REDIS_SERVER_BIN` / `redis-server`.
    pub fn start_with(bin: impl AsRef<OsStr>, args: &[&str]) -> RedisServer {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Self::start_configured(bin.as_ref().to_os_string(), |_port| args.clone())
    }

    /// Starts `count` independent servers (see [`start`](Self::start)) in
    /// parallel, one thread each, so starting five costs about as much as
    /// starting one. Same as [`RedisMasters::start`](crate::RedisMasters::start).
    ///
    /// # Panics
    ///
    /// Like [`start`](Self::start) if any of them does not come up; the
    /// others are killed first.
    pub fn start_many(count: usize) -> crate::RedisMasters {
        crate::RedisMasters::start(count)
    }

    /// The workhorse behind every constructor: `args_for_port` computes the
    /// extra arguments for the port being tried (a cluster node names its
    /// config file after its port and needs a second, bus, port). It is called
    /// again with a fresh port if the first one turns out to be taken; the
    /// arguments of the successful attempt are kept for [`restart`](Self::restart).
    pub(crate) fn start_configured(
        bin: OsString,
        args_for_port: impl Fn(u16) -> Vec<String>,
    ) -> RedisServer {
        let dir = TempDir::new("lock-tests-redis");
        for attempt in 1..=START_ATTEMPTS {
            let port = free_port();
            let args = args_for_port(port);
            match launch(&bin, &args, port, &dir, Instant::now() + READY_TIMEOUT) {
                Ok(child) => {
                    return RedisServer {
                        bin,
                        args,
                        port,
                        pid: child.id(),
                        child: Some(child),
                        paused: AtomicBool::new(false),
                        dir,
                    };
                }
                Err(LaunchError::PortInUse) if attempt < START_ATTEMPTS => {}
                Err(LaunchError::PortInUse) => fail(
                    &bin,
                    port,
                    &dir,
                    "every port tried was taken (Address already in use)",
                ),
                Err(LaunchError::Failed(reason)) => fail(&bin, port, &dir, &reason),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The TCP port on `127.0.0.1`; it stays the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("the server URL is valid")
    }

    /// A plain multiplexed connection for test assertions (`HGET`, `EXISTS`, ...).
    ///
    /// Its timeouts are generous (5 s to connect, 10 s per response) so that
    /// assertions do not flake on a loaded machine; wrap a command in
    /// `tokio::time::timeout` to expect a hang.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connect(&self.client())
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url()))
    }

    /// Kills the process with `SIGKILL` (a crash: all data is lost) and waits
    /// for it to exit. Does nothing if it is not running. A paused server is
    /// killed without being resumed, so requests it has not processed yet
    /// never run.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            child
                .wait()
                .unwrap_or_else(|e| panic!("waiting for redis-server {}: {e}", self.pid));
            self.paused.store(false, Ordering::SeqCst);
        }
    }

    /// Starts the server again on the same port and directory (killing it
    /// first if it is still running) and waits until it answers `PING`.
    /// Retries for up to 15 s while the port is still taken.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + RESTART_TIMEOUT;
        loop {
            let ready_by = deadline.max(Instant::now() + READY_TIMEOUT);
            match launch(&self.bin, &self.args, self.port, &self.dir, ready_by) {
                Ok(child) => {
                    self.pid = child.id();
                    self.child = Some(child);
                    return;
                }
                Err(LaunchError::PortInUse) if Instant::now() < deadline => {
                    while !bindable(self.port) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                Err(LaunchError::PortInUse) => fail(
                    &self.bin,
                    self.port,
                    &self.dir,
                    &format!("port still taken after {RESTART_TIMEOUT:?}"),
                ),
                Err(LaunchError::Failed(reason)) => fail(&self.bin, self.port, &self.dir, &reason),
            }
        }
    }

    /// Freezes the process with `SIGSTOP` and waits until it is stopped.
    /// Clients can still connect, but no command is answered until
    /// [`resume`](Self::resume).
    pub fn pause(&self) {
        let pid = self.running_pid("pause");
        signal(pid, libc::SIGSTOP).expect("SIGSTOP redis-server");
        self.paused.store(true, Ordering::SeqCst);
        await_stopped(pid, true, Duration::from_secs(5));
    }

    /// Continues a paused process with `SIGCONT` and waits until it runs.
    pub fn resume(&self) {
        let pid = self.running_pid("resume");
        signal(pid, libc::SIGCONT).expect("SIGCONT redis-server");
        self.paused.store(false, Ordering::SeqCst);
        await_stopped(pid, false, Duration::from_secs(5));
    }

    /// Whether the process is running, i.e. it was not [`kill`](Self::kill)ed
    /// (or was [`restart`](Self::restart)ed since). A paused server is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process is frozen by [`pause`](Self::pause).
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Process id of the current server process (or of the last one, if killed).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's log file so far (all runs, restarts included).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(LOG_FILE)).unwrap_or_default()
    }

    /// The extra arguments it runs with (after the harness's own).
    pub(crate) fn args(&self) -> &[String] {
        &self.args
    }

    fn running_pid(&self, what: &str) -> u32 {
        assert!(
            self.child.is_some(),
            "cannot {what} redis-server on port {}: it is not running",
            self.port
        );
        self.pid
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused.load(Ordering::SeqCst) {
                let _ = signal(child.id(), libc::SIGCONT);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", diagnostics(self.port, &self.dir));
        }
    }
}

/// `$REDIS_SERVER_BIN`, or `redis-server` (looked up on `PATH`).
pub(crate) fn default_bin() -> OsString {
    std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into())
}

/// Runs `start(i)` for every `i in 0..count` on its own thread and returns
/// the servers in order. If any start panics, the servers that did come up
/// are dropped (killed) and the first panic is resumed on this thread.
pub(crate) fn start_parallel(
    count: usize,
    start: impl Fn(usize) -> RedisServer + Sync,
) -> Vec<RedisServer> {
    let start = &start;
    let results: Vec<std::thread::Result<RedisServer>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count).map(|i| scope.spawn(move || start(i))).collect();
        handles.into_iter().map(|handle| handle.join()).collect()
    });
    let mut servers = Vec::with_capacity(count);
    let mut failure = None;
    for result in results {
        match result {
            Ok(server) => servers.push(server),
            Err(payload) => failure = failure.or(Some(payload)),
        }
    }
    if let Some(payload) = failure {
        drop(servers);
        std::panic::resume_unwind(payload);
    }
    servers
}

/// Spawns one server process on `port` and waits until it answers `PING`.
fn launch(
    bin: &OsStr,
    args: &[String],
    port: u16,
    dir: &TempDir,
    deadline: Instant,
) -> Result<Child, LaunchError> {
    let log_path = dir.path().join(LOG_FILE);
    let stdio_path = dir.path().join(STDIO_FILE);
    let log_start = file_len(&log_path);
    let stdio_start = file_len(&stdio_path);
    let stdio = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&stdio_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", stdio_path.display()));
    let stderr = stdio.try_clone().expect("duplicate a file handle");
    let mut command = Command::new(bin);
    command
        .arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--logfile")
        .arg(&log_path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(stdio)
        .stderr(stderr);
    let mut child = match spawn(command) {
        Ok(child) => child,
        Err(e) if e.kind() == io::ErrorKind::NotFound => panic!(
            "redis-server not found: install it (Debian: apt-get install redis-server) \
             or set REDIS_SERVER_BIN (tried {bin:?}: {e})"
        ),
        Err(e) => panic!(
            "cannot run {bin:?}: {e}; install redis-server (Debian: apt-get install \
             redis-server) or set REDIS_SERVER_BIN to a working binary"
        ),
    };
    let pid = child.id();
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait on redis-server") {
            let output = read_from(&log_path, log_start) + &read_from(&stdio_path, stdio_start);
            return Err(if output.contains("Address already in use") {
                LaunchError::PortInUse
            } else {
                LaunchError::Failed(format!("it exited with {status}"))
            });
        }
        if answers_ping(port, pid) {
            return Ok(child);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LaunchError::Failed(
                "it did not answer PING in time (killed it)".into(),
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(25));
    }
}

/// Whether the server on `port` answers `PING` and is process `pid` (and
/// not some other server that took the port first).
fn answers_ping(port: u16, pid: u32) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let io_timeout = Some(Duration::from_secs(2));
    if stream.set_read_timeout(io_timeout).is_err()
        || stream.set_write_timeout(io_timeout).is_err()
        || stream
            .write_all(b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
            .is_err()
    {
        return false;
    }
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line != "+PONG\r\n" {
        return false; // e.g. `-LOADING`
    }
    line.clear();
    let Some(len) = reader
        .read_line(&mut line)
        .ok()
        .and_then(|_| line.trim_end().strip_prefix('$')?.parse::<usize>().ok())
    else {
        return false;
    };
    let mut info = vec![0; len + 2];
    if reader.read_exact(&mut info).is_err() {
        return false;
    }
    String::from_utf8_lossy(&info)
        .lines()
        .any(|l| l.strip_prefix("process_id:") == Some(&pid.to_string()))
}

fn fail(bin: &OsStr, port: u16, dir: &TempDir, reason: &str) -> ! {
    panic!(
        "redis-server ({bin:?}) did not come up on 127.0.0.1:{port}: {reason}\n{}",
        diagnostics(port, dir)
    )
}

/// The server log plus anything the process wrote to stdout/stderr.
fn diagnostics(port: u16, dir: &TempDir) -> String {
    let log_path = dir.path().join(LOG_FILE);
    let mut text = format!(
        "----- redis-server log, port {port} ({}) -----\n{}",
        log_path.display(),
        read_from(&log_path, 0)
    );
    let stdio = read_from(&dir.path().join(STDIO_FILE), 0);
    if !stdio.trim().is_empty() {
        text += &format!("----- redis-server stdout/stderr -----\n{stdio}");
    }
    text + "----- end of redis-server output -----"
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The contents of `path` from byte `start` on (empty if it does not exist).
fn read_from(path: &Path, start: u64) -> String {
    let mut bytes = Vec::new();
    if let Ok(file) = File::open(path) {
        let mut file = io::BufReader::new(file);
        let _ = io::copy(&mut (&mut file).take(start), &mut io::sink());
        let _ = file.read_to_end(&mut bytes);
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A multiplexed connection with generous timeouts (5 s to connect, 10 s per response,
/// where redis-rs gives up after 1 s and 500 ms): the tests' own commands and their
/// worker processes' must not fail for a machine loaded with a whole suite's servers.
pub async fn connect(
    client: &redis::Client,
) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}
