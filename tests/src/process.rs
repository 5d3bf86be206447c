//! Process plumbing: temporary directories, spawning children that die with
//! the test process, and job-control signals.

// The one place in the workspace with unsafe code: libc calls (kill, prctl, geteuid).
#![allow(unsafe_code)]

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A directory under [`std::env::temp_dir`] removed (with its contents) on drop.
#[derive(Debug)]
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<temp>/<prefix>-<pid>-<counter>-<nanos>`. The first call in a
    /// process for each prefix also removes directories of that prefix left by
    /// processes that no longer exist (test binaries killed before they could clean
    /// up, and the templates and shared servers a process keeps in statics, which
    /// are never dropped).
    pub(crate) fn new(prefix: &str) -> TempDir {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        static SWEPT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        {
            let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
            if !swept.iter().any(|p| p == prefix) {
                swept.push(prefix.to_owned());
                remove_stale(prefix);
            }
        }
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|e| panic!("cannot create temp dir {}: {e}", path.display()));
        TempDir(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

/// Removes `<temp>/<prefix>-<pid>-...` directories whose process is gone.
fn remove_stale(prefix: &str) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix)?.strip_prefix('-'))
            .and_then(|rest| rest.split('-').next()?.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // SAFETY: kill(2) with signal 0 only checks whether `pid` exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if pid > 0 && gone {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `command` in a session of its own, as a service's daemon runs; on Linux the
/// child gets `SIGKILL` when the test process dies.
///
/// The session matters to speed: with the kernel's autogroup scheduling (Debian's
/// default), CPU is shared between sessions first, then between the threads of each.
/// A server in the caller's session competes with the caller's threads for one share:
/// a single-threaded Redis is then preempted by the very clients waiting on it, and a
/// benchmark measures that more than the clients. In its own session it gets a share
/// of its own, as a daemon does.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
/// the process, and test threads come and go. So all children are forked by
/// one dedicated thread that lives as long as the process.
pub(crate) fn spawn(mut command: Command) -> io::Result<Child> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id();
        // SAFETY: the closure runs between fork and exec and only makes
        // async-signal-safe system calls (setsid, prctl, getppid, raise).
        unsafe {
            command.pre_exec(move || {
                // Fails only for a process group leader, which a forked child is not.
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before prctl took effect.
                if libc::getppid() as u32 != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("lock-tests-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("cannot start the process-spawning thread");
        requests
    });
    let (reply, result) = mpsc::channel();
    spawner
        .send((command, reply))
        .expect("process-spawning thread is gone");
    result.recv().expect("process-spawning thread is gone")
}

/// Sends `signal` to `pid`.
pub(crate) fn signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(io::Error::other)?;
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, signal) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Waits (up to `timeout`) until process `pid` is stopped (`want_stopped`) or
/// running again, as reported by `/proc/<pid>/stat`. Returns immediately on
/// systems without procfs.
pub(crate) fn await_stopped(pid: u32, want_stopped: bool, timeout: Duration) {
    let stat = format!("/proc/{pid}/stat");
    let deadline = Instant::now() + timeout;
    loop {
        let Ok(text) = std::fs::read_to_string(&stat) else {
            return;
        };
        // Format: `pid (comm) S ...`; comm may contain spaces and parentheses.
        let state = text
            .rfind(')')
            .and_then(|end| text[end + 1..].split_whitespace().next())
            .unwrap_or("?");
        let stopped = state == "T" || state == "t";
        if stopped == want_stopped {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "process {pid} did not become {} within {timeout:?} (state {state})",
                if want_stopped { "stopped" } else { "running" }
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether the test process runs as root.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Starts a server on a free port: spawns `command(port)` and polls `ready(port)` for up
/// to `within`. A child that exits first (its port was taken, most likely) is started
/// again on another port, five times at most; then this panics with `what` and `log()`.
pub(crate) fn launch_on_free_port(
    what: &str,
    within: Duration,
    mut command: impl FnMut(u16) -> Command,
    ready: impl Fn(u16) -> bool,
    log: impl Fn() -> String,
) -> (Child, u16) {
    for _ in 0..5 {
        let port = crate::port::free_port();
        let mut child = spawn(command(port)).unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break; // port taken, most likely: try another
            }
            if ready(port) {
                return (child, port);
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not start in {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("{what} would not start: {}", log());
}

/// The directory `make` fills once per test process (a database's initialized data
/// dir), kept in `cell`; `make` is tried `tries` times (a bootstrap under load fails now
/// and then) and panics with its last error.
pub(crate) fn template_dir(
    cell: &'static OnceLock<TempDir>,
    prefix: &str,
    tries: u32,
    make: impl Fn(&Path) -> Result<(), String>,
) -> &'static Path {
    cell.get_or_init(|| {
        let dir = TempDir::new(prefix);
        let mut last = String::new();
        for _ in 0..tries {
            match make(dir.path()) {
                Ok(()) => return dir,
                Err(e) => last = e,
            }
        }
        panic!("{prefix}: failed {tries} times: {last}");
    })
    .path()
}

/// `cp -a from to`: a copy of a template, owners kept.
pub(crate) fn copy_dir(from: &Path, to: &Path) {
    let copied = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("run cp");
    assert!(
        copied.success(),
        "cannot copy {} to {}",
        from.display(),
        to.display()
    );
}
