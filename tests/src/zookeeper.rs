//! A throw-away standalone ZooKeeper server (Java): a `zoo.cfg` in a temp dir, the
//! server on a free loopback port with a 200 ms tick (sessions from 400 ms), killed
//! and removed on drop; it can be paused (SIGSTOP) to cut its clients off silently.
//!
//! The server is started through Debian's `zkServer.sh start-foreground` (which execs
//! java, so the pid is the server's); `$ZOOKEEPER_HOME/bin/zkServer.sh` if set.
//! `scripts/ensure-zookeeper` installs Debian's `zookeeper` package.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::process::{TempDir, launch_on_free_port, signal};

/// One private ZooKeeper server.
#[derive(Debug)]
pub struct ZooKeeperServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

fn script() -> PathBuf {
    let home = std::env::var_os("ZOOKEEPER_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/zookeeper"));
    home.join("bin/zkServer.sh")
}

impl ZooKeeperServer {
    /// Starts a fresh server; panics with instructions if ZooKeeper is missing.
    pub fn start() -> ZooKeeperServer {
        let dir = TempDir::new("lock-tests-zookeeper");
        let (cfg, data) = (dir.path().join("zoo.cfg"), dir.path().join("data"));
        std::fs::create_dir_all(&data).expect("zookeeper data dir");
        let log_path = dir.path().join("zookeeper.log");
        let (child, port) = launch_on_free_port(
            "zookeeper (run scripts/ensure-zookeeper if it is missing)",
            Duration::from_secs(60),
            |port| {
                std::fs::write(
                    &cfg,
                    format!(
                        "tickTime=200\ndataDir={}\nclientPort={port}\nclientPortAddress=127.0.0.1\n\
                         maxClientCnxns=0\nadmin.enableServer=false\n\
                         4lw.commands.whitelist=ruok,stat,wchp\n",
                        data.display()
                    ),
                )
                .expect("write zoo.cfg");
                let log = std::fs::File::create(&log_path).expect("log file");
                let mut c = Command::new("bash");
                c.arg(script())
                    .arg("start-foreground")
                    .arg(&cfg)
                    .env("ZOO_LOG_DIR", dir.path())
                    .env("ZOO_LOG4J_PROP", "INFO,CONSOLE")
                    .env(
                        "JVMFLAGS",
                        "-Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1",
                    )
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().expect("log file"))
                    .stderr(log);
                c
            },
            ruok,
            || std::fs::read_to_string(&log_path).unwrap_or_default(),
        );
        ZooKeeperServer {
            child: Some(child),
            port,
            dir,
        }
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`: a connect string (append `/chroot` for one).
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The server's process id (for reading its CPU time).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the server (SIGSTOP): its clients see silence, not a closed socket.
    pub fn pause(&self) {
        if let Some(c) = &self.child {
            signal(c.id(), libc::SIGSTOP).expect("SIGSTOP zookeeper");
        }
    }

    /// Resumes a paused server.
    pub fn resume(&self) {
        if let Some(c) = &self.child {
            signal(c.id(), libc::SIGCONT).expect("SIGCONT zookeeper");
        }
    }

    /// How many sessions watch `path` (a server path, chroot included), as the
    /// server's `wchp` lists them: a waiter's watch on its predecessor, a holder's on
    /// its own node.
    pub fn watchers_of(&self, path: &str) -> usize {
        let listing = four_letter(self.port, "wchp");
        let mut lines = listing.lines().skip_while(|l| *l != path).skip(1);
        lines.by_ref().take_while(|l| l.starts_with('\t')).count()
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("zookeeper.log")).unwrap_or_default()
    }
}

/// Whether the server answers `ruok` with `imok`.
fn ruok(port: u16) -> bool {
    four_letter(port, "ruok").contains("imok")
}

/// The server's answer to a four-letter command (empty if it cannot be asked).
fn four_letter(port: u16, command: &str) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(command.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

impl Drop for ZooKeeperServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = signal(child.id(), libc::SIGCONT);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
