//! A throw-away MariaDB server: `mariadb-install-db` into a temp dir, `mariadbd` on a
//! free loopback port with grant tables off (any user, no password), a database
//! `locks`; killed and removed on drop. A test can kill it (`SIGKILL`) and restart it
//! on the same port and data.
//!
//! Binaries: `$MARIADB_BIN_DIR/{mariadbd,mariadb-install-db,mariadb}` if set, else
//! `/usr/sbin/mariadbd` and `mariadb-install-db` / `mariadb` on `PATH`
//! (`scripts/ensure-mariadb` installs Debian's `mariadb-server`). As root the server
//! runs with `--user=root`, which MariaDB accepts when asked explicitly.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::process::{TempDir, copy_dir, is_root, launch_on_free_port, spawn, template_dir};

/// How long a (re)started server gets to answer.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One private MariaDB server.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    extra: Vec<String>,
}

fn program(name: &str) -> OsString {
    if let Some(dir) = std::env::var_os("MARIADB_BIN_DIR") {
        return PathBuf::from(dir).join(name).into_os_string();
    }
    if name == "mariadbd" {
        return "/usr/sbin/mariadbd".into();
    }
    name.into()
}

/// `--user=root` when the tests run as root: MariaDB runs as root only when told so.
fn as_root() -> Option<&'static str> {
    is_root().then_some("--user=root")
}

impl MariaDbServer {
    /// Starts a fresh server; panics with instructions if MariaDB is missing. It
    /// flushes its log once a second, not at every commit
    /// (`--innodb-flush-log-at-trx-commit=0`): fast, and a kill can lose the last
    /// second.
    pub fn start() -> MariaDbServer {
        Self::start_with_args(&[])
    }

    /// Starts a fresh server with `extra` options after the defaults (a later option
    /// wins, e.g. `--innodb-flush-log-at-trx-commit=1` for commits that survive a kill).
    pub fn start_with_args(extra: &[&str]) -> MariaDbServer {
        let dir = TempDir::new("lock-tests-mariadb");
        // One `mariadb-install-db` per test process (several at once fail now and then,
        // and each takes seconds), copied for every server.
        copy_dir(&template().join("data"), &dir.path().join("data"));
        let extra: Vec<String> = extra.iter().map(|a| a.to_string()).collect();
        let (child, port) = launch_on_free_port(
            "mariadbd",
            START_TIMEOUT,
            |port| command(&dir, port, &extra),
            create_database,
            || Self::read_log(&dir),
        );
        MariaDbServer {
            child: Some(child),
            port,
            dir,
            extra,
        }
    }

    /// Kills the server (`SIGKILL`: no shutdown, what InnoDB did not write is lost)
    /// and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data (killing it first if it is
    /// still running) and waits until it answers; InnoDB recovers from its log.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            let mut child = spawn(command(&self.dir, self.port, &self.extra))
                .unwrap_or_else(|e| panic!("cannot start mariadbd: {e}"));
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // the port or the data dir's lock not yet free: again
                }
                if create_database(self.port) {
                    self.child = Some(child);
                    return;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "mariadbd did not restart in {START_TIMEOUT:?}: {}",
            self.log()
        );
    }

    fn read_log(dir: &TempDir) -> String {
        std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:<port>/locks`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/locks", self.port)
    }

    /// The server's error log so far.
    pub fn log(&self) -> String {
        Self::read_log(&self.dir)
    }
}

/// `mariadbd` on `port` over the data dir in `dir`, with `extra` options last.
fn command(dir: &TempDir, port: u16, extra: &[String]) -> Command {
    let path = |file: &str| dir.path().join(file).display().to_string();
    let mut c = Command::new(program("mariadbd"));
    c.arg("--no-defaults")
        .arg(format!("--datadir={}", path("data")))
        .arg(format!("--port={port}"))
        .arg(format!("--socket={}", path("mysqld.sock")))
        .arg(format!("--pid-file={}", path("mysqld.pid")))
        .arg(format!("--log-error={}", path("error.log")))
        .args([
            "--bind-address=127.0.0.1",
            "--skip-grant-tables",
            "--skip-log-bin",
            "--innodb-buffer-pool-size=16M",
            "--innodb-log-file-size=16M",
            "--innodb-flush-log-at-trx-commit=0",
            "--max-connections=300",
        ])
        .args(as_root())
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// The data dir made once per test process by `mariadb-install-db` (retried: a
/// bootstrap under load fails now and then).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<TempDir> = OnceLock::new();
    template_dir(&TEMPLATE, "lock-tests-mariadb-template", 3, |dir| {
        let data = dir.join("data");
        let _ = std::fs::remove_dir_all(&data);
        let out = Command::new(program("mariadb-install-db"))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--skip-test-db", "--auth-root-authentication-method=normal"])
            .args(["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=16M"])
            .args(as_root())
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "mariadb-install-db not found ({e}): run scripts/ensure-mariadb or set MARIADB_BIN_DIR"
                )
            });
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    })
}

/// Creates the database `locks`; false while the server does not answer yet.
fn create_database(port: u16) -> bool {
    Command::new(program("mariadb"))
        .args(["--no-defaults", "-h", "127.0.0.1", "-u", "root"])
        .arg(format!("-P{port}"))
        .args(["-e", "CREATE DATABASE IF NOT EXISTS locks"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
