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
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::process::{TempDir, copy_dir, is_root, launch_on_free_port, template_dir};

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
        copy_dir(&template().join("data"), &data);
        let log_path = dir.path().join("postgres.log");
        let (child, port) = launch_on_free_port(
            "postgres",
            Duration::from_secs(30),
            |port| {
                let log = std::fs::File::create(&log_path).expect("log file");
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
                c
            },
            |port| TcpStream::connect(("127.0.0.1", port)).is_ok() && ready(port),
            || std::fs::read_to_string(&log_path).unwrap_or_default(),
        );
        PostgresServer {
            child: Some(child),
            port,
            dir,
        }
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
fn hand_to_postgres(dir: &Path) {
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
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<TempDir> = OnceLock::new();
    template_dir(&TEMPLATE, "lock-tests-postgres-template", 2, |dir| {
        hand_to_postgres(dir);
        let data = dir.join("data");
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
                panic!("initdb not found ({e}): run scripts/ensure-postgres or set PG_BIN_DIR")
            });
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    })
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
