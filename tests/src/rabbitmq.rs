//! A throw-away RabbitMQ node: `rabbitmq-server` with everything private to the test
//! (node name, data directory, AMQP and distribution ports, Erlang cookie, and an
//! `epmd` of its own on a free port), the default `guest` user on 127.0.0.1; killed and
//! removed on drop. A test can kill it (`SIGKILL`) and restart it on the same ports and
//! data, where durable queues and persistent messages survive.
//!
//! Programs: `$RABBITMQ_BIN_DIR/rabbitmq-server` if set, else
//! `/usr/lib/rabbitmq/bin/rabbitmq-server` (the script behind Debian's
//! `/usr/sbin/rabbitmq-server`, which would switch users); `epmd` on `PATH`.
//! `scripts/ensure-rabbitmq` installs Debian's `rabbitmq-server`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::port::{bindable, free_port};
use crate::process::{TempDir, spawn};

/// How long a (re)started node gets to accept AMQP connections (a boot takes about
/// 5 s on an idle machine).
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// One private RabbitMQ node.
#[derive(Debug)]
pub struct RabbitMqServer {
    node: Option<Child>,
    epmd: Option<Child>,
    amqp: u16,
    dist: u16,
    epmd_port: u16,
    dir: TempDir,
}

fn server_program() -> PathBuf {
    std::env::var_os("RABBITMQ_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/lib/rabbitmq/bin"))
        .join("rabbitmq-server")
}

impl RabbitMqServer {
    /// Starts a fresh node; panics with instructions if RabbitMQ is missing.
    pub fn start() -> RabbitMqServer {
        let dir = TempDir::new("lock-tests-rabbitmq");
        let file = |name: &str, text: &str| {
            std::fs::write(dir.path().join(name), text)
                .unwrap_or_else(|e| panic!("cannot write {name}: {e}"));
        };
        file("enabled_plugins", "[].\n");
        // Its log goes to a file under log/, read by `log()`, not to the console.
        file("rabbitmq.conf", "log.console = false\n");
        // The cookie Erlang reads from $HOME; only the owner may read it.
        let cookie = dir.path().join(".erlang.cookie");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        file(
            ".erlang.cookie",
            &format!("lock-tests-{}-{nanos}", std::process::id()),
        );
        set_mode(&cookie, 0o400);
        let mut server = RabbitMqServer {
            node: None,
            epmd: None,
            amqp: 0,
            dist: 0,
            epmd_port: 0,
            dir,
        };
        for _ in 0..5 {
            server.amqp = free_port();
            server.dist = free_port();
            server.epmd_port = free_port();
            match start_epmd(server.epmd_port) {
                Ok(epmd) => server.epmd = Some(epmd),
                Err(_) => continue,
            }
            if server.launch().is_ok() {
                return server;
            }
            // A port taken meanwhile, most likely: others.
            server.stop_all();
        }
        panic!("rabbitmq-server would not start: {}", server.log());
    }

    fn command(&self) -> Command {
        let path = |p: &str| self.dir.path().join(p);
        let mut c = Command::new(server_program());
        c.current_dir(self.dir.path())
            .env("HOME", self.dir.path())
            .env(
                "RABBITMQ_NODENAME",
                format!("lock-tests-{}@localhost", self.amqp),
            )
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.amqp.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist.to_string())
            .env("ERL_EPMD_PORT", self.epmd_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", path("mnesia"))
            .env("RABBITMQ_LOG_BASE", path("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", path("rabbitmq"))
            .env("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config"))
            .env("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf"))
            .env("RABBITMQ_PID_FILE", path("node.pid"))
            // The script then runs the Erlang VM in its own process (exec), so the
            // harness's child is the node itself.
            .env("RUNNING_UNDER_SYSTEMD", "1")
            // No busy-waiting schedulers: on a small machine shared with the rest of
            // the test, spinning Erlang schedulers would starve the service.
            .env(
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS",
                "+sbwt none +sbwtdcpu none +sbwtdio none",
            )
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null());
        match std::fs::File::create(path("node.log")) {
            Ok(log) => {
                let err = log
                    .try_clone()
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null());
                c.stdout(Stdio::from(log)).stderr(err);
            }
            Err(_) => {
                c.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        c
    }

    /// Starts the node and waits until it speaks AMQP; `Err` if it exited first.
    fn launch(&mut self) -> Result<(), String> {
        let mut node = spawn(self.command()).unwrap_or_else(|e| {
            panic!(
                "cannot start {} ({e}): run scripts/ensure-rabbitmq or set RABBITMQ_BIN_DIR",
                server_program().display()
            )
        });
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = node.try_wait() {
                return Err(format!("rabbitmq-server exited: {status}"));
            }
            if speaks_amqp(self.amqp) {
                self.node = Some(node);
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = node.kill();
                let _ = node.wait();
                panic!(
                    "rabbitmq-server did not start in {START_TIMEOUT:?}: {}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The AMQP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.amqp
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f` (the default vhost).
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp)
    }

    /// The node's output and its log file so far.
    pub fn log(&self) -> String {
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let file = format!("lock-tests-{}@localhost.log", self.amqp);
        read(self.dir.path().join("node.log")) + &read(self.dir.path().join("log").join(file))
    }

    /// Kills the node (`SIGKILL`: no shutdown) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut node) = self.node.take() {
            let _ = node.kill();
            let _ = node.wait();
        }
    }

    /// Starts the node again on the same ports and data (killing it first if it is
    /// still running) and waits until it speaks AMQP.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            while !(bindable(self.amqp) && bindable(self.dist)) {
                assert!(Instant::now() < deadline, "RabbitMQ's ports stay taken");
                std::thread::sleep(Duration::from_millis(20));
            }
            match self.launch() {
                Ok(()) => return,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "rabbitmq-server did not restart: {e}: {}",
                    self.log()
                ),
            }
        }
    }

    fn stop_all(&mut self) {
        self.kill();
        if let Some(mut epmd) = self.epmd.take() {
            let _ = epmd.kill();
            let _ = epmd.wait();
        }
    }
}

impl Drop for RabbitMqServer {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// `epmd` in the foreground on `port`, a child of the harness (so it dies with it),
/// once it accepts connections.
fn start_epmd(port: u16) -> Result<Child, String> {
    let mut c = Command::new("epmd");
    c.arg("-port")
        .arg(port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut epmd = spawn(c).map_err(|e| format!("cannot start epmd: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(Some(status)) = epmd.try_wait() {
            return Err(format!("epmd exited: {status}"));
        }
        if TcpStream::connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok() {
            return Ok(epmd);
        }
        if Instant::now() >= deadline {
            let _ = epmd.kill();
            let _ = epmd.wait();
            return Err("epmd did not listen".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a broker on `port` answers the AMQP 0-9-1 protocol header with a method
/// frame (`connection.start`): up and accepting clients.
fn speaks_amqp(port: u16) -> bool {
    let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let Ok(mut s) = TcpStream::connect_timeout(&addr.into(), Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut first = [0u8; 1];
    s.write_all(b"AMQP\x00\x00\x09\x01").is_ok()
        && s.read_exact(&mut first).is_ok()
        && first[0] == 1
}

fn set_mode(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}
