//! A throw-away MariaDB server: `mariadb-install-db` into a temp dir, `mariadbd` on a
//! free loopback port with grant tables off (any user, no password), a database
//! `locks`; killed and removed on drop.
//!
//! Binaries: `$MARIADB_BIN_DIR/{mariadbd,mariadb-install-db,mariadb}` if set, else
//! `/usr/sbin/mariadbd` and `mariadb-install-db` / `mariadb` on `PATH`
//! (`scripts/ensure-mariadb` installs Debian's `mariadb-server`). As root the server
//! runs with `--user=root`, which MariaDB accepts when asked explicitly.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::port::free_port;
use crate::process::{TempDir, spawn};

/// One private MariaDB server.
#[derive(Debug)]
pub struct MariaDbServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
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

fn user() -> &'static str {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        "root"
    } else {
        ""
    }
}

impl MariaDbServer {
    /// Starts a fresh server; panics with instructions if MariaDB is missing.
    pub fn start() -> MariaDbServer {
        let dir = TempDir::new("lock-tests-mariadb");
        let data = dir.path().join("data");
        // One `mariadb-install-db` per test process (several at once fail now and then,
        // and each takes seconds), copied for every server.
        let template = template();
        let copied = Command::new("cp")
            .arg("-a")
            .arg(template.join("data"))
            .arg(&data)
            .status()
            .expect("run cp");
        assert!(copied.success(), "cannot copy the MariaDB data template");
        for _ in 0..5 {
            let port = free_port();
            let mut c = Command::new(program("mariadbd"));
            c.arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--port={port}"))
                .arg(format!(
                    "--socket={}",
                    dir.path().join("mysqld.sock").display()
                ))
                .arg(format!(
                    "--pid-file={}",
                    dir.path().join("mysqld.pid").display()
                ))
                .arg(format!(
                    "--log-error={}",
                    dir.path().join("error.log").display()
                ))
                .args([
                    "--bind-address=127.0.0.1",
                    "--skip-grant-tables",
                    "--skip-log-bin",
                    "--innodb-buffer-pool-size=16M",
                    "--innodb-log-file-size=16M",
                    "--innodb-flush-log-at-trx-commit=0",
                    "--max-connections=300",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if !user().is_empty() {
                c.arg(format!("--user={}", user()));
            }
            let mut child = spawn(c).expect("start mariadbd");
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken, most likely: try another
                }
                if create_database(port) {
                    return MariaDbServer {
                        child: Some(child),
                        port,
                        dir,
                    };
                }
                assert!(Instant::now() < deadline, "mariadbd did not start in 60 s");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("mariadbd would not start: {}", Self::read_log(&dir));
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

/// The data dir made once per test process by `mariadb-install-db` (retried: a
/// bootstrap under load fails now and then).
fn template() -> &'static std::path::Path {
    static TEMPLATE: std::sync::OnceLock<TempDir> = std::sync::OnceLock::new();
    TEMPLATE
        .get_or_init(|| {
            let dir = TempDir::new("lock-tests-mariadb-template");
            let mut last = String::new();
            for _ in 0..3 {
                let data = dir.path().join("data");
                let _ = std::fs::remove_dir_all(&data);
                let mut install = Command::new(program("mariadb-install-db"));
                install
                    .arg("--no-defaults")
                    .arg(format!("--datadir={}", data.display()))
                    .args(["--skip-test-db", "--auth-root-authentication-method=normal"])
                    .args(["--innodb-buffer-pool-size=16M", "--innodb-log-file-size=16M"]);
                if !user().is_empty() {
                    install.arg(format!("--user={}", user()));
                }
                let out = install.output().unwrap_or_else(|e| {
                    panic!(
                        "mariadb-install-db not found ({e}): run scripts/ensure-mariadb or set MARIADB_BIN_DIR"
                    )
                });
                if out.status.success() {
                    return dir;
                }
                last = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            panic!("mariadb-install-db failed three times: {last}");
        })
        .path()
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
