//! [`TcpProxy`]: a TCP forwarder that can silently partition a client from
//! its server, or lose a single reply or request ([`faults`]).

mod faults;
mod pump;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::port::free_port;

/// Fresh ports tried by [`TcpProxy::start`] when the chosen one gets taken.
const BIND_ATTEMPTS: usize = 5;
/// How long a connection waits for the target to accept it.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a single write may block. A write stuck on a peer that does not
/// read is retried in slices this long, so [`TcpProxy::cut`] never waits
/// longer than this for a write in progress.
const WRITE_SLICE: Duration = Duration::from_millis(50);
/// Bytes read (and, while cut, held) at a time, per direction and connection.
const BUFFER_SIZE: usize = 16 * 1024;

/// A TCP proxy on its own `127.0.0.1` port that forwards every connection to
/// `127.0.0.1:<target_port>`, usually a [`RedisServer`](crate::RedisServer),
/// and can simulate a network partition between the two.
///
/// [`cut`](Self::cut) stops forwarding in both directions, on every current
/// and future connection, *without closing anything*: the client's requests
/// simply go unanswered, with no RST or FIN, as on a silent network.
/// [`heal`](Self::heal) resumes forwarding where it stopped.
///
/// While cut:
///
/// * No byte, FIN or RST reaches either side. Bytes are **held, not
///   dropped**: data the proxy had already read from a socket (at most 16 KiB
///   per direction and connection) waits in the proxy, the rest stays in the
///   kernel's socket buffers, and once those are full the sender blocks, as
///   with a real stalled TCP connection. After [`heal`](Self::heal)
///   everything is delivered, in order, so a request sent while cut is
///   executed (and answered) only after the heal.
/// * New connections are still accepted (the client's connect succeeds), but
///   the connection to the target is only opened after the heal, so the
///   server does not even see the client until then.
/// * A side that closes its connection is not seen closing by the other side
///   until the heal.
///
/// A connection the target refuses is closed. A connection reset by one side
/// is closed (with a FIN) on the other.
///
/// A single reply can be lost instead, the request having been executed:
/// [`reset_next_reply`](Self::reset_next_reply),
/// [`reset_reply_to`](Self::reset_reply_to) (the reply to a request told by
/// its bytes) and [`close_after_reply_to`](Self::close_after_reply_to) (the
/// connection drops just after a reply); or a request, before the server
/// sees it: [`reset_request`](Self::reset_request).
///
/// Everything runs on plain threads with blocking sockets (one for the
/// listener, two per connection), independent of any async runtime, so a
/// proxy can be created in a `#[tokio::test]` or a plain `#[test]` and may
/// outlive a runtime. Dropping it closes the listener and every connection on
/// both sides (a client then sees its connection closed rather than a hang)
/// and joins all its threads.
///
/// ```
/// use lock_tests::{RedisServer, TcpProxy};
///
/// let server = RedisServer::start();
/// let proxy = TcpProxy::start(server.port());
/// assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
/// proxy.cut();
/// assert!(proxy.is_cut());
/// proxy.heal();
/// assert!(!proxy.is_cut());
/// ```
pub struct TcpProxy {
    port: u16,
    target_port: u16,
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
}

/// State shared by the proxy handle and its threads.
struct Shared {
    state: Mutex<State>,
    /// Signalled whenever `cut`, `shutdown` or `writing` changes.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    /// Whether forwarding is stopped ([`TcpProxy::cut`]).
    cut: bool,
    /// Connections numbered below this hold their bytes ([`TcpProxy::strand`]).
    stranded_before: u64,
    /// Set once by `Drop`: every thread winds down.
    shutdown: bool,
    /// Socket operations (writes, shutdowns) forwarding data right now;
    /// [`TcpProxy::cut`] waits for them to finish.
    writing: usize,
    /// Clones of every open socket, by connection, so `Drop` can close them.
    connections: HashMap<u64, Vec<TcpStream>>,
    next_id: u64,
    /// One thread per connection, joined by `Drop`.
    threads: Vec<JoinHandle<()>>,
    /// Replies armed to be lost.
    faults: faults::Faults,
}

impl TcpProxy {
    /// Listens on a free `127.0.0.1` port (see [`free_port`](crate::free_port)) and forwards
    /// every connection to `127.0.0.1:target_port`. Forwarding is on.
    ///
    /// Returns as soon as the listener is bound; nothing is checked about the
    /// target until a client connects (it need not be up yet).
    ///
    /// # Panics
    ///
    /// If no port can be bound.
    pub fn start(target_port: u16) -> TcpProxy {
        let listener = bind();
        let port = listener
            .local_addr()
            .expect("local address of the proxy listener")
            .port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let accept_thread = std::thread::Builder::new()
            .name(format!("tcp-proxy-{port}"))
            .spawn({
                let shared = Arc::clone(&shared);
                move || accept_loop(listener, port, target_port, &shared)
            })
            .expect("spawn the proxy's accept thread");
        TcpProxy {
            port,
            target_port,
            shared,
            accept_thread: Some(accept_thread),
        }
    }

    /// The proxy's own TCP port on `127.0.0.1`: connect here.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port on `127.0.0.1` that connections are forwarded to.
    pub fn target_port(&self) -> u16 {
        self.target_port
    }

    /// `redis://127.0.0.1:PORT/`, with the proxy's [`port`](Self::port).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client for [`url`](Self::url).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("the proxy URL is valid")
    }

    /// Stops forwarding, in both directions, on every current and future
    /// connection, without closing any of them (see the [type-level
    /// docs](Self) for what happens to the bytes).
    ///
    /// When it returns, the partition is complete: no further byte is written
    /// to any socket until [`heal`](Self::heal). A write that was already in
    /// progress is waited for first (at most ~50 ms, even if its peer does
    /// not read); the bytes it delivers were read before the call, like
    /// packets already on the wire. Cutting a cut proxy does nothing.
    pub fn cut(&self) {
        let mut state = self.shared.lock();
        state.cut = true;
        while state.writing > 0 && !state.shutdown {
            state = self.shared.wait(state);
        }
    }

    /// Stops forwarding on the connections open now only, as [`cut`](Self::cut)
    /// does, while connections made later are forwarded: a path that went silent
    /// for the sockets it carried (a stale NAT or conntrack entry, a failed-over
    /// address) while a new connection gets through.
    pub fn strand(&self) {
        let mut state = self.shared.lock();
        state.stranded_before = state.next_id;
        while state.writing > 0 && !state.shutdown {
            state = self.shared.wait(state);
        }
    }

    /// Resumes forwarding: the bytes held since [`cut`](Self::cut) or
    /// [`strand`](Self::strand) are delivered in order, connections accepted
    /// meanwhile are connected to the target. Healing a proxy that is not cut
    /// does nothing.
    pub fn heal(&self) {
        let mut state = self.shared.lock();
        state.cut = false;
        state.stranded_before = 0;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Whether forwarding is stopped by [`cut`](Self::cut).
    pub fn is_cut(&self) -> bool {
        self.shared.lock().cut
    }
}

impl fmt::Debug for TcpProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("TcpProxy")
            .field("port", &self.port)
            .field("target_port", &self.target_port)
            .field("cut", &state.cut)
            .field("connections", &state.connections.len())
            .finish()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        let connections = {
            let mut state = self.shared.lock();
            state.shutdown = true;
            std::mem::take(&mut state.connections)
        };
        self.shared.changed.notify_all();
        // Wakes every thread blocked reading or writing; the peers see a FIN.
        for stream in connections.values().flatten() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        if let Some(accept_thread) = self.accept_thread.take() {
            // Wake the accept loop with a connection of our own: it sees
            // `shutdown` and returns, dropping (closing) the listener.
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
            if TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                let _ = accept_thread.join();
            }
            // Otherwise the listener is unreachable and the thread stays
            // blocked in `accept`: leave it rather than hang here.
        }
        let threads = std::mem::take(&mut self.shared.lock().threads);
        for thread in threads {
            let _ = thread.join();
        }
    }
}

impl State {
    /// Whether connection `id` holds its bytes now.
    fn holds(&self, id: u64) -> bool {
        self.cut || id < self.stranded_before
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking proxy thread must not wedge the test that owns it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(guard).unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks while connection `id` is cut off. `false` once the proxy is
    /// shutting down.
    fn await_healed(&self, id: u64) -> bool {
        let mut state = self.lock();
        while state.holds(id) && !state.shutdown {
            state = self.wait(state);
        }
        !state.shutdown
    }

    /// Runs `op` (one socket operation that forwards something on connection
    /// `id`) as soon as that connection is not cut off, such that
    /// [`TcpProxy::cut`] waits for it. `None` if the proxy is shutting down.
    fn forward<T>(&self, id: u64, op: impl FnOnce() -> T) -> Option<T> {
        {
            let mut state = self.lock();
            while state.holds(id) && !state.shutdown {
                state = self.wait(state);
            }
            if state.shutdown {
                return None;
            }
            state.writing += 1;
        }
        let result = op();
        let mut state = self.lock();
        state.writing -= 1;
        if state.writing == 0 {
            self.changed.notify_all();
        }
        Some(result)
    }

    fn is_shutdown(&self) -> bool {
        self.lock().shutdown
    }
}

/// Binds a listener on a free port outside the ephemeral range (so that a
/// client reconnecting to a dropped proxy cannot end up connected to itself).
fn bind() -> TcpListener {
    let mut last_error = None;
    for _ in 0..BIND_ATTEMPTS {
        match TcpListener::bind((Ipv4Addr::LOCALHOST, free_port())) {
            Ok(listener) => return listener,
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_error = Some(e),
            Err(e) => panic!("cannot bind a TCP proxy on 127.0.0.1: {e}"),
        }
    }
    panic!(
        "cannot bind a TCP proxy on 127.0.0.1: every port tried was taken ({})",
        last_error.expect("at least one attempt was made")
    )
}

fn accept_loop(listener: TcpListener, port: u16, target_port: u16, shared: &Arc<Shared>) {
    loop {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(_) if shared.is_shutdown() => return,
            Err(e) => {
                // E.g. out of file descriptors, or a connection aborted
                // before it was accepted: try again shortly.
                eprintln!("TcpProxy on port {port}: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let _ = client.set_nodelay(true);
        let Ok(client_clone) = client.try_clone() else {
            continue; // Dropping `client` closes it.
        };
        let mut state = shared.lock();
        if state.shutdown {
            return; // `client` is the wake-up connection, or arrived too late.
        }
        let id = state.next_id;
        state.next_id += 1;
        state.connections.insert(id, vec![client_clone]);
        state.threads.retain(|thread| !thread.is_finished());
        let spawned = std::thread::Builder::new()
            .name(format!("tcp-proxy-{port}-{id}"))
            .spawn({
                let shared = Arc::clone(shared);
                move || {
                    pump::serve(client, port, target_port, &shared, id);
                    shared.forget_faults(id);
                    shared.lock().connections.remove(&id);
                }
            });
        match spawned {
            Ok(thread) => state.threads.push(thread),
            Err(e) => {
                eprintln!("TcpProxy on port {port}: cannot spawn a connection thread: {e}");
                state.connections.remove(&id);
            }
        }
    }
}
