//! [`Monitor`]: a raw `MONITOR` connection recording every command executed.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

use crate::RedisServer;

/// How long [`RedisServer::monitor`] waits for the server to confirm `MONITOR`.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects a raw TCP socket, sends `MONITOR`, and collects every command line
/// the server reports, for assertions such as "no `EVALSHA` was sent while
/// the lock was held".
///
/// Lines look like
/// `1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc..." "1" ...`
/// (the leading `+` of the RESP simple string is stripped). Commands run by
/// a Lua script are reported too, as `[0 lua] "HSET" ...`. Every command
/// executed after [`RedisServer::monitor`] returned is reported, including
/// the handshake of new connections (`HELLO`, `CLIENT SETINFO`, ...).
///
/// The connection dies with the server: after [`RedisServer::kill`] the
/// monitor only returns what it had already received. Take a new one after
/// [`RedisServer::restart`].
#[derive(Debug)]
pub struct Monitor {
    stream: TcpStream,
    /// Bytes received but not yet split into lines.
    partial: Vec<u8>,
    /// Complete lines not yet returned.
    lines: VecDeque<String>,
    closed: bool,
}

impl RedisServer {
    /// Opens a [`Monitor`]; returns once the server confirmed it (`+OK`), so
    /// every command executed afterwards is reported.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or does not confirm within 10 s.
    pub async fn monitor(&self) -> Monitor {
        let port = self.port();
        let subscribe = async {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
            stream.write_all(b"*1\r\n$7\r\nMONITOR\r\n").await?;
            let mut received = Vec::new();
            let mut chunk = [0u8; 4096];
            while !received.starts_with(b"+OK\r\n") {
                let n = stream.read(&mut chunk).await?;
                received.extend_from_slice(&chunk[..n]);
                if n == 0 || (received.len() >= 5 && !received.starts_with(b"+OK\r\n")) {
                    let reply = String::from_utf8_lossy(&received);
                    return Err(std::io::Error::other(format!("unexpected reply {reply:?}")));
                }
            }
            received.drain(..5);
            Ok(Monitor {
                stream,
                partial: received,
                lines: VecDeque::new(),
                closed: false,
            })
        };
        match timeout(SUBSCRIBE_TIMEOUT, subscribe).await {
            Ok(Ok(monitor)) => monitor,
            Ok(Err(e)) => panic!("MONITOR on 127.0.0.1:{port} failed: {e}"),
            Err(_) => panic!("MONITOR on 127.0.0.1:{port}: no +OK within {SUBSCRIBE_TIMEOUT:?}"),
        }
    }
}

impl Monitor {
    /// Returns the lines not returned before: those already received plus
    /// those arriving during the next `within` (it always waits that long,
    /// unless the server is gone; pass [`Duration::ZERO`] to take only what
    /// has arrived already).
    ///
    /// To assert that something did *not* happen, send a marker command
    /// (e.g. `ECHO end`) after the interval of interest and use
    /// [`wait_for`](Self::wait_for) on it instead: the server reports
    /// commands in order.
    pub async fn lines_within(&mut self, within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        while self.receive_until(deadline).await {}
        self.lines.drain(..).collect()
    }

    /// Waits up to `timeout` for a line containing `needle` (for instance
    /// `"\"PING\""`, or `"\"ECHO\" \"marker\""`). On success, returns every
    /// line not returned before up to and including the match; lines after
    /// it stay for the next call. On timeout returns `None` and keeps all
    /// lines for the next call.
    pub async fn wait_for(&mut self, needle: &str, timeout: Duration) -> Option<Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut checked = 0;
        loop {
            if let Some(i) = self
                .lines
                .iter()
                .skip(checked)
                .position(|l| l.contains(needle))
            {
                return Some(self.lines.drain(..=checked + i).collect());
            }
            checked = self.lines.len();
            if !self.receive_until(deadline).await {
                return None;
            }
        }
    }

    /// Waits for `times` lines containing `needle` (see [`wait_for`](Self::wait_for)),
    /// each within `timeout` of the one before; `None` if one did not come.
    pub async fn wait_for_times(
        &mut self,
        needle: &str,
        times: usize,
        timeout: Duration,
    ) -> Option<()> {
        for _ in 0..times {
            self.wait_for(needle, timeout).await?;
        }
        Some(())
    }

    /// Reads once (waiting at most until `deadline`) and splits complete
    /// lines off. Returns false when the deadline passed or the connection
    /// is closed.
    async fn receive_until(&mut self, deadline: Instant) -> bool {
        if self.closed {
            return false;
        }
        let mut chunk = [0u8; 16 * 1024];
        // `read` is cancel-safe: a timed-out read loses no data.
        let n = match tokio::time::timeout_at(deadline, self.stream.read(&mut chunk)).await {
            Err(_elapsed) => return false,
            Ok(Ok(n)) => n,
            Ok(Err(_)) => 0,
        };
        if n == 0 {
            self.closed = true;
            return false;
        }
        self.partial.extend_from_slice(&chunk[..n]);
        while let Some(end) = self.partial.windows(2).position(|w| w == b"\r\n") {
            let raw: Vec<u8> = self.partial.drain(..end + 2).collect();
            let line = String::from_utf8_lossy(&raw[..end]);
            self.lines
                .push_back(line.strip_prefix('+').unwrap_or(&line).to_owned());
        }
        true
    }
}
