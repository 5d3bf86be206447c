//! A throw-away etcd cluster: `n` members (`etcd` from Debian's `etcd-server`, or
//! `$ETCD_BIN`) on free loopback ports, each with its data dir in one temp dir, with
//! short heartbeats (50 ms) and elections (500 ms) so that a lost leader is replaced
//! within a second. Members can be killed and started again on their ports and data,
//! and paused (`SIGSTOP`) to cut their peers and clients off silently; a client can be
//! cut off alone through TCP proxies ([`EtcdCluster::proxied`]). Dropped, every
//! member is killed and the directory removed.
//!
//! `scripts/ensure-etcd` installs Debian's `etcd-server` package.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::TcpProxy;
use crate::process::{TempDir, await_stopped, signal, spawn};

/// One member's ports and process.
#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    child: Option<Child>,
}

/// A private etcd cluster.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    dir: TempDir,
    /// The `--initial-cluster` value every member starts with.
    initial: String,
}

fn binary() -> PathBuf {
    std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl EtcdCluster {
    /// Starts a cluster of `n` members and waits until it has a leader and every
    /// member answers; panics with the members' logs if it does not within 60 s.
    pub fn start(n: usize) -> EtcdCluster {
        assert!(n >= 1, "an etcd cluster needs a member");
        let dir = TempDir::new("lock-tests-etcd");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client: crate::free_port(),
                peer: crate::free_port(),
                child: None,
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            dir,
            initial,
        };
        for i in 0..n {
            cluster.launch(i);
        }
        cluster.await_healthy(&(0..n).collect::<Vec<_>>(), Duration::from_secs(60));
        cluster
    }

    fn launch(&mut self, i: usize) {
        let m = &self.members[i];
        let data = self.dir.path().join(&m.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .expect("etcd log file");
        let client = format!("http://127.0.0.1:{}", m.client);
        let peer = format!("http://127.0.0.1:{}", m.peer);
        let mut c = Command::new(binary());
        c.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.token()])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log file"))
            .stderr(log);
        let child = spawn(c).unwrap_or_else(|e| {
            panic!("cannot start etcd (run scripts/ensure-etcd if it is missing): {e}")
        });
        self.members[i].child = Some(child);
    }

    /// Unique per cluster, so members of two test clusters never join each other.
    fn token(&self) -> String {
        self.dir
            .path()
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Waits until each of `members` answers its health check with a leader known.
    pub fn await_healthy(&self, members: &[usize], within: Duration) {
        let deadline = Instant::now() + within;
        for &i in members {
            while !healthy(self.members[i].client) {
                if let Some(c) = &self.members[i].child {
                    assert!(
                        signal(c.id(), 0).is_ok(),
                        "etcd member {i} exited: {}",
                        self.log(i)
                    );
                }
                assert!(
                    Instant::now() < deadline,
                    "etcd member {i} not healthy within {within:?}: {}",
                    self.log(i)
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never: [`start`](Self::start) needs one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `http://127.0.0.1:<port>` of every member, for a raw `etcd-client`.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://127.0.0.1:{}", m.client))
            .collect()
    }

    /// Member `i`'s client port.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client
    }

    /// `etcd://127.0.0.1:<p1>,127.0.0.1:<p2>,.../<prefix>`: every member, for
    /// `EtcdLocks::connect` and `AnyLocks`.
    pub fn url(&self, prefix: &str) -> String {
        self.url_from(0, prefix)
    }

    /// [`url`](Self::url) with member `first` named first (the member a client calls
    /// first) and the others in order after it.
    pub fn url_from(&self, first: usize, prefix: &str) -> String {
        let n = self.members.len();
        let hosts: Vec<String> = (0..n)
            .map(|i| format!("127.0.0.1:{}", self.members[(first + i) % n].client))
            .collect();
        format!("etcd://{}/{prefix}", hosts.join(","))
    }

    /// A TCP proxy in front of each member, and the connect string through them:
    /// cutting every proxy cuts a client so connected off the whole cluster, silently,
    /// while other clients go on.
    pub fn proxied(&self, prefix: &str) -> (Vec<TcpProxy>, String) {
        let proxies: Vec<TcpProxy> = self
            .members
            .iter()
            .map(|m| TcpProxy::start(m.client))
            .collect();
        let hosts: Vec<String> = proxies
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.port()))
            .collect();
        (proxies, format!("etcd://{}/{prefix}", hosts.join(",")))
    }

    /// The running members' process ids (for reading their CPU time).
    pub fn pids(&self) -> Vec<u32> {
        self.members
            .iter()
            .filter_map(|m| m.child.as_ref().map(Child::id))
            .collect()
    }

    /// Kills member `i` (`SIGKILL`); its data stays for [`restart`](Self::restart).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = signal(c.id(), libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed member `i` again on its ports and data (it rejoins the
    /// cluster); returns without waiting for it.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].child.is_none(), "member {i} still runs");
        self.launch(i);
    }

    /// Freezes member `i` (`SIGSTOP`): its peers and clients see silence.
    pub fn pause(&self, i: usize) {
        if let Some(c) = &self.members[i].child {
            signal(c.id(), libc::SIGSTOP).expect("SIGSTOP etcd");
            await_stopped(c.id(), true, Duration::from_secs(5));
        }
    }

    /// Resumes a paused member `i`.
    pub fn resume(&self, i: usize) {
        if let Some(c) = &self.members[i].child {
            signal(c.id(), libc::SIGCONT).expect("SIGCONT etcd");
            await_stopped(c.id(), false, Duration::from_secs(5));
        }
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        let path = self
            .dir
            .path()
            .join(format!("{}.log", self.members[i].name));
        let log = std::fs::read_to_string(path).unwrap_or_default();
        // The end says why it failed; a whole log would drown the test's output.
        let start = log.len().saturating_sub(4000);
        let start = (start..log.len())
            .find(|&b| log.is_char_boundary(b))
            .unwrap_or(log.len());
        log[start..].to_owned()
    }
}

/// Whether the member on `port` answers `GET /health` with `"health":"true"` (it
/// has a leader and can serve).
fn healthy(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    if s.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
