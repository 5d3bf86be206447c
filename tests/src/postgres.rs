//! A throw-away PostgreSQL server: `initdb` into a temp dir, `postgres` on a free
//! loopback port, killed and removed on drop.
//!
//! PostgreSQL refuses to run as root; when the tests run as root (CI), the data dir is
//! handed to the `postgres` system user (created by Debian's package) and both
//! programs run as that user through `setpriv`. The binaries come from
//! `$PG_BIN_DIR`, else the newest `/usr/lib/postgresql/<version>/bin`, else `PATH`
//! (`scripts/ensure-postgres` installs Debian's `postgresql`).

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::port::free_port;
use crate::process::{TempDir, spawn};

/// One private PostgreSQL server (user `postgres`, trust auth, database `postgres`).
#[derive(Debug)]
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn program(name: &str) -> OsString {
    match bin_dir() {
        Some(dir) => dir.join(name).into_os_string(),
        None => name.into(),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// `program args...`, as the `postgres` user when we are root (`setpriv` execs the
/// program itself, so signals reach it, and `--pdeathsig` ties it to the test process
/// as the harness does for every server).
fn command(program: OsString) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--pdeathsig=KILL",
            "--",
        ])
        .arg(program);
        c
    } else {
        Command::new(program)
    }
}

impl PostgresServer {
    /// Starts a fresh server; panics with instructions if PostgreSQL is missing.
    pub fn start() -> PostgresServer {
        let dir = TempDir::new("lock-tests-postgres");
        let data = dir.path().join("data");
        hand_to_postgres(dir.path());
        // One initdb per test process, copied (with its owner) for every server.
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template().join("data"))
            .arg(&data)
            .status()
            .expect("run cp");
        assert!(copied.success(), "cannot copy the PostgreSQL data template");
        for _ in 0..5 {
            let port = free_port();
            let log = std::fs::File::create(dir.path().join("postgres.log")).expect("log file");
            let mut c = command(program("postgres"));
            c.arg("-D")
                .arg(&data)
                .args(["-p", &port.to_string(), "-k"])
                .arg(dir.path())
                .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
                .args(["-c", "max_connections=200"])
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log file"))
                .stderr(log);
            let mut child = spawn(c).expect("start postgres");
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken, most likely: try another
                }
                if TcpStream::connect(("127.0.0.1", port)).is_ok() && ready(port) {
                    return PostgresServer {
                        child: Some(child),
                        port,
                        dir,
                    };
                }
                assert!(Instant::now() < deadline, "postgres did not start in 30 s");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!(
            "postgres would not start: {}",
            std::fs::read_to_string(dir.path().join("postgres.log")).unwrap_or_default()
        );
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

/// Gives `dir` to the `postgres` user when we are root (PostgreSQL refuses root).
fn hand_to_postgres(dir: &std::path::Path) {
    if !is_root() {
        return;
    }
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(dir)
        .status()
        .expect("run chown");
    assert!(
        status.success(),
        "cannot hand {} to the postgres user; is Debian's postgresql installed \
         (scripts/ensure-postgres)?",
        dir.display()
    );
}

/// The data dir made once per test process by initdb (retried once under load).
fn template() -> &'static std::path::Path {
    static TEMPLATE: std::sync::OnceLock<TempDir> = std::sync::OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let dir = TempDir::new("lock-tests-postgres-template");
            hand_to_postgres(dir.path());
            let mut last = String::new();
            for _ in 0..2 {
                let data = dir.path().join("data");
                let _ = std::fs::remove_dir_all(&data);
                let out = command(program("initdb"))
                    .args([
                        "-A",
                        "trust",
                        "-U",
                        "postgres",
                        "--no-sync",
                        "-E",
                        "UTF8",
                        "-D",
                    ])
                    .arg(&data)
                    .output()
                    .unwrap_or_else(|e| {
                        panic!(
                            "initdb not found ({e}): run scripts/ensure-postgres or set PG_BIN_DIR"
                        )
                    });
                if out.status.success() {
                    return dir;
                }
                last = String::from_utf8_lossy(&out.stderr).into_owned();
            }
            panic!("initdb failed twice: {last}");
        })
        .path()
}

/// Whether the server accepts sessions yet (`pg_isready`'s question, asked by
/// connecting: the startup packet is answered once recovery is over).
fn ready(port: u16) -> bool {
    let out = command(program("pg_isready"))
        .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
        .status();
    out.map(|s| s.success()).unwrap_or(false)
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Immediate shutdown (setpriv exec'd postgres: the pid is the postmaster's).
            let _ = crate::process::signal(child.id(), libc::SIGQUIT);
            let _ = child.wait();
        }
    }
}
