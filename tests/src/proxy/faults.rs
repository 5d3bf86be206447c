//! Faults on one exchange: a reply lost after the server executed its request
//! ([`TcpProxy::reset_next_reply`], [`TcpProxy::reset_reply_to`]), a reply followed by
//! a partition ([`TcpProxy::close_after_reply_to`]), a reply held back until the test
//! lets it go ([`TcpProxy::hold_reply_to`]), a request lost before the server saw it
//! ([`TcpProxy::reset_request`]).

use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream};

use super::pump::write_again;
use super::{Shared, TcpProxy};

/// Tells a request (one chunk the client sent, as the proxy read it) by its bytes.
type Matcher = Box<dyn Fn(&[u8]) -> bool + Send>;

/// What becomes of a chunk: a connection's next one from the server, or (`LoseRequest`)
/// the matching request itself.
#[derive(Clone, Copy, Debug)]
pub(super) enum Fault {
    /// Dropped; the connection is reset toward the client, closed toward the server.
    Reset,
    /// Forwarded; then the connection is closed (FIN) both ways and the proxy is cut.
    CloseAfter,
    /// The request is dropped as by `Reset`.
    LoseRequest,
    /// Held, with whatever follows on the connection, until [`TcpProxy::release_reply`].
    Hold,
}

/// The faults armed on a proxy.
#[derive(Default)]
pub(super) struct Faults {
    /// [`TcpProxy::reset_next_reply`]: the next chunk from the server on any connection.
    next_reply: bool,
    /// The next request that matches, and the fault its reply meets.
    request: Option<(Matcher, Fault)>,
    /// Connections whose next chunk from the server meets a fault.
    armed: HashMap<u64, Fault>,
    /// Connections a fault ended: their other direction stops without forwarding a
    /// close (which would reach the client as a FIN before the reset).
    ended: HashSet<u64>,
    /// A reply is held by [`TcpProxy::hold_reply_to`] until
    /// [`TcpProxy::release_reply`].
    holding: bool,
}

impl TcpProxy {
    /// Arms the proxy: the next chunk of bytes it reads from the server, on any
    /// connection, is not forwarded; that connection is reset toward the client (RST)
    /// and closed toward the server. Fires once, then disarms.
    ///
    /// The request was forwarded, so the server executed it; only the reply is lost,
    /// as when a connection breaks while a reply is on the wire. Chunks are what one
    /// `read` returned: a reply the server sends in pieces loses its first piece with
    /// the rest. On a protocol with traffic of its own (pings, notifications), prefer
    /// [`reset_reply_to`](Self::reset_reply_to).
    pub fn reset_next_reply(&self) {
        self.shared.lock().faults.next_reply = true;
    }

    /// Arms the proxy for one request: the next chunk a client sends, on any
    /// connection, for which `request` is true is forwarded, and the next chunk the
    /// server sends on that connection (the reply, or whatever came first) is dropped
    /// as by [`reset_next_reply`](Self::reset_next_reply): the connection is reset
    /// toward the client and closed toward the server, so no reply sent after the
    /// request reaches the client. Fires once; arming again replaces an unfired one.
    ///
    /// `request` sees each chunk as read (usually one or more whole requests) and runs
    /// on a proxy thread with the proxy's lock held: keep it quick.
    pub fn reset_reply_to(&self, request: impl Fn(&[u8]) -> bool + Send + 'static) {
        self.shared.lock().faults.request = Some((Box::new(request), Fault::Reset));
    }

    /// Arms the proxy for one request, as [`reset_reply_to`](Self::reset_reply_to),
    /// except that the server's next chunk on that connection is forwarded; then the
    /// connection is closed (FIN) toward both sides and the proxy is
    /// [`cut`](Self::cut), so the client sees its connection drop just after the reply
    /// and cannot reconnect until [`heal`](Self::heal).
    pub fn close_after_reply_to(&self, request: impl Fn(&[u8]) -> bool + Send + 'static) {
        self.shared.lock().faults.request = Some((Box::new(request), Fault::CloseAfter));
    }

    /// Arms the proxy for one request, as [`reset_reply_to`](Self::reset_reply_to),
    /// except that the server's next chunk on that connection (the reply) waits in the
    /// proxy, with everything after it on that connection, until
    /// [`release_reply`](Self::release_reply); then it is delivered in order. The
    /// server executed the request at once: its answer reaches the client late, as
    /// over a slow network. [`is_holding`](Self::is_holding) tells when the reply is
    /// held. Fires once; arming again replaces an unfired fault.
    ///
    /// ```
    /// use std::io::{Read, Write};
    /// use lock_tests::{RedisServer, TcpProxy};
    ///
    /// let server = RedisServer::start();
    /// let proxy = TcpProxy::start(server.port());
    /// proxy.hold_reply_to(|chunk| chunk.starts_with(b"INCR"));
    /// let mut conn = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    /// conn.write_all(b"INCR n\r\n").unwrap();
    /// while !proxy.is_holding() {
    ///     std::thread::sleep(std::time::Duration::from_millis(1));
    /// }
    /// proxy.release_reply();
    /// let mut reply = [0; 4];
    /// conn.read_exact(&mut reply).unwrap();
    /// assert_eq!(&reply, b":1\r\n");
    /// ```
    pub fn hold_reply_to(&self, request: impl Fn(&[u8]) -> bool + Send + 'static) {
        self.shared.lock().faults.request = Some((Box::new(request), Fault::Hold));
    }

    /// Whether a reply armed by [`hold_reply_to`](Self::hold_reply_to) is held now.
    pub fn is_holding(&self) -> bool {
        self.shared.lock().faults.holding
    }

    /// Lets a reply held by [`hold_reply_to`](Self::hold_reply_to) go, with what came
    /// after it. Does nothing when none is held.
    pub fn release_reply(&self) {
        self.shared.lock().faults.holding = false;
        self.shared.changed.notify_all();
    }

    /// Arms the proxy for one request: the next chunk a client sends, on any
    /// connection, for which `request` is true is not forwarded; the connection is
    /// reset toward the client and closed toward the server, as when a connection
    /// breaks with a request on the wire. The server never sees the request. Fires
    /// once; arming again replaces an unfired [`reset_reply_to`](Self::reset_reply_to)
    /// or [`close_after_reply_to`](Self::close_after_reply_to) too.
    pub fn reset_request(&self, request: impl Fn(&[u8]) -> bool + Send + 'static) {
        self.shared.lock().faults.request = Some((Box::new(request), Fault::LoseRequest));
    }

    /// Whether a request fault ([`reset_request`](Self::reset_request), or the
    /// reply faults armed by a request) still waits for its request: false once it
    /// fired.
    pub fn is_request_armed(&self) -> bool {
        self.shared.lock().faults.request.is_some()
    }
}

impl Shared {
    /// The client sent `chunk` on connection `id`: the fault it meets itself, if any
    /// (before it is forwarded).
    pub(super) fn client_sent(&self, id: u64, chunk: &[u8]) -> Option<Fault> {
        let mut state = self.lock();
        let faults = &mut state.faults;
        let (matches, fault) = faults.request.as_ref()?;
        if !matches(chunk) {
            return None;
        }
        let fault = *fault;
        faults.request = None;
        if let Fault::LoseRequest = fault {
            faults.ended.insert(id);
            return Some(fault);
        }
        faults.armed.insert(id, fault);
        None
    }

    /// The fault that the server's chunk just read on connection `id` meets, if any. A
    /// held chunk meets none: this returns once [`TcpProxy::release_reply`] lets it go
    /// (or the proxy shuts down, which stops its forwarding).
    pub(super) fn reply_fault(&self, id: u64) -> Option<Fault> {
        let mut state = self.lock();
        let faults = &mut state.faults;
        let fault = match faults.armed.remove(&id) {
            Some(fault) => fault,
            None if faults.next_reply => Fault::Reset,
            None => return None,
        };
        if let Fault::Hold = fault {
            faults.holding = true;
            while state.faults.holding && !state.shutdown {
                state = self.wait(state);
            }
            return None;
        }
        faults.next_reply = false;
        faults.ended.insert(id);
        Some(fault)
    }

    /// Whether a fault ended connection `id`.
    pub(super) fn fault_ended(&self, id: u64) -> bool {
        self.lock().faults.ended.contains(&id)
    }

    /// Connection `id` is closed: nothing armed on it is left.
    pub(super) fn forget_faults(&self, id: u64) {
        let mut state = self.lock();
        state.faults.armed.remove(&id);
        state.faults.ended.remove(&id);
    }

    /// Applies `fault` to `chunk`, just read from one of `client` and `server`.
    pub(super) fn apply(&self, fault: Fault, chunk: &[u8], client: &TcpStream, server: &TcpStream) {
        match fault {
            Fault::Reset | Fault::LoseRequest => reset(client),
            // Held in `reply_fault`, then forwarded: never applied, nothing to close.
            Fault::Hold => return,
            Fault::CloseAfter => {
                let _ = write_fully(client, chunk);
                self.lock().cut = true;
                let _ = client.shutdown(Shutdown::Both);
            }
        }
        let _ = server.shutdown(Shutdown::Both);
    }
}

/// Resets `stream` toward its peer: with a zero linger the last close of the socket
/// sends an RST, and shutting down reading wakes the proxy thread still reading it,
/// so that close comes as soon as both threads let go of it (nothing is sent now).
fn reset(stream: &TcpStream) {
    if let Ok(dup) = stream.try_clone() {
        let _ = tokio::net::TcpSocket::from_std_stream(dup).set_zero_linger();
    }
    let _ = stream.shutdown(Shutdown::Read);
}

/// Writes all of `bytes`, retrying the write slices that time out.
fn write_fully(mut to: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match to.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if write_again(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
