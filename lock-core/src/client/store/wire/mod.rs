//! A connection of our own to one Redis node ([`Wire`]): commands pipelined over one
//! socket (TCP or a Unix socket, RESP2), opened again when it breaks.
//!
//! It does what a redis-rs `ConnectionManager` does for this crate, for less per
//! command: a command is written straight into the connection's outbox (no channel to
//! a connection task, no codec), a batch's replies are read in one read and handed out
//! under one lock, and a reply is parsed by a parser that knows only what a command
//! connection is answered with ([`resp`]). It is also a redis-rs `ConnectionLike`, so
//! script invocations and the server checks run on it unchanged. A deployment it cannot
//! speak to (TLS, RESP3) stays on the `ConnectionManager`.
//!
//! When the link breaks, the calls waiting on it fail (whether their commands ran is
//! unknown, as with any lost connection); the next call opens a new link, once for all
//! the calls that find the old one gone (a failed attempt is the error of every call
//! that waited for it), and a call that found the link gone before writing anything is
//! sent on the new one. Each link's tasks run on the runtime of the call that opened
//! it; when that runtime ends, so does the link, and the next call opens one on its own.

mod link;
mod resp;

pub(crate) use link::dropped;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ConnectionAddr, ConnectionInfo, Pipeline, ProtocolVersion, RedisError, RedisFuture,
};
use redis::{RedisResult, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::args::{Args, Pipe};
use crate::client::cleanup::OnDrop;
use link::{Link, Reply};

/// Where and how to open a link.
pub(crate) struct Opener {
    addr: Addr,
    username: Option<String>,
    password: Option<String>,
    db: i64,
    /// Bounds one attempt to open a link, the handshake included.
    timeout: Duration,
    /// Attempts after the first fails, within one call.
    retries: usize,
}

enum Addr {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl Opener {
    /// How to open links to `info`'s node, if a [`Wire`] can speak to it (plain TCP or a
    /// Unix socket, RESP2); each attempt within `timeout`, `retries` more after a failure.
    pub(crate) fn for_node(
        info: &ConnectionInfo,
        timeout: Duration,
        retries: usize,
    ) -> Option<Self> {
        let settings = info.redis_settings();
        if settings.protocol() != ProtocolVersion::RESP2 {
            return None;
        }
        let addr = match info.addr() {
            ConnectionAddr::Tcp(host, port) => Addr::Tcp(host.clone(), *port),
            ConnectionAddr::Unix(path) => Addr::Unix(path.clone()),
            _ => return None,
        };
        Some(Self {
            addr,
            username: settings.username().map(str::to_owned),
            password: settings.password().map(str::to_owned),
            db: settings.db(),
            timeout,
            retries,
        })
    }

    /// A new link, trying again after a failure (see `retries`).
    async fn open(&self) -> RedisResult<Arc<Link>> {
        let mut attempt = 0;
        loop {
            match self.open_once().await {
                Err(e) if attempt < self.retries => {
                    tracing::debug!(error = %e, "lock-core: connecting to Redis failed; trying again");
                    let pause = Duration::from_millis(50) * 2u32.pow(attempt.min(5) as u32);
                    tokio::time::sleep(pause.min(Duration::from_secs(1))).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn open_once(&self) -> RedisResult<Arc<Link>> {
        let opening = async {
            match &self.addr {
                Addr::Tcp(host, port) => {
                    let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                    stream.set_nodelay(true)?;
                    let (r, w) = stream.into_split();
                    self.handshake(r, w).await
                }
                Addr::Unix(path) => {
                    let (r, w) = tokio::net::UnixStream::connect(path).await?.into_split();
                    self.handshake(r, w).await
                }
            }
        };
        match tokio::time::timeout(self.timeout, opening).await {
            Ok(made) => made,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connecting to Redis did not finish within the command timeout",
            )
            .into()),
        }
    }

    /// Authenticates and selects the database, then starts the link's tasks.
    async fn handshake<R, W>(&self, mut r: R, mut w: W) -> RedisResult<Arc<Link>>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let mut hello = Vec::new();
        let mut want = 0;
        if let Some(password) = &self.password {
            let mut auth = redis::cmd("AUTH");
            if let Some(user) = &self.username {
                auth.arg(user);
            }
            auth.arg(password).write_packed_command(&mut hello);
            want += 1;
        }
        if self.db != 0 {
            redis::cmd("SELECT")
                .arg(self.db)
                .write_packed_command(&mut hello);
            want += 1;
        }
        w.write_all(&hello).await?;
        let mut buf = Vec::with_capacity(512);
        let mut at = 0;
        while want > 0 {
            match resp::parse(&buf[at..])? {
                Some((v, n)) => {
                    at += n;
                    v.extract_error()?;
                    want -= 1;
                }
                None if r.read_buf(&mut buf).await? == 0 => {
                    return Err(dropped("Redis closed the connection during the handshake"));
                }
                None => {}
            }
        }
        // A write stuck for twice the command timeout holds only calls whose callers
        // have all given up (a queued call's limit is twice the timeout).
        Ok(Link::start(
            r,
            w,
            buf.split_off(at),
            self.timeout.saturating_mul(2),
        ))
    }
}

/// A connection of our own to one node; cheap to clone (the clones share it).
#[derive(Clone)]
pub(crate) struct Wire {
    shared: Arc<Shared>,
}

struct Shared {
    opener: Opener,
    link: RwLock<Option<Arc<Link>>>,
    /// Held while a link is opened, so the calls that find the link gone open one;
    /// it holds the last attempt's error if it failed.
    opening: tokio::sync::Mutex<Option<RedisError>>,
    /// Attempts to open a link so far.
    attempts: AtomicU64,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(link) = self.link.get_mut().unwrap_or_else(PoisonError::into_inner) {
            link.close();
        }
    }
}

impl Wire {
    /// A connection that opens its first link on its first call.
    pub(crate) fn lazy(opener: Opener) -> Self {
        Self {
            shared: Arc::new(Shared {
                opener,
                link: RwLock::new(None),
                opening: tokio::sync::Mutex::new(None),
                attempts: AtomicU64::new(0),
            }),
        }
    }

    /// A connection with its first link open.
    pub(crate) async fn open(opener: Opener) -> RedisResult<Self> {
        let wire = Self::lazy(opener);
        wire.reopen().await?;
        Ok(wire)
    }

    /// Runs one command: its reply, an error reply as an error (as redis-rs's
    /// `query_async`).
    pub(crate) async fn query(&self, cmd: &Args) -> RedisResult<Value> {
        self.one(|b| cmd.write(b)).await?.extract_error()
    }

    async fn one(&self, write: impl Fn(&mut Vec<u8>)) -> RedisResult<Value> {
        match self.exchange(1, write).await? {
            Reply::One(v) => Ok(v),
            Reply::Many(mut v) => v.pop().ok_or_else(|| dropped("a reply went missing")),
        }
    }

    /// Runs `pipe` in one write: each command's reply, an error reply as a value.
    pub(crate) async fn pipeline(&self, pipe: &Pipe<'_>) -> RedisResult<Vec<Value>> {
        self.many(pipe.count, |b| b.extend_from_slice(pipe.commands))
            .await
    }

    /// `pipe` packed as redis-rs packs it (a transaction's `MULTI` and `EXEC` included),
    /// answered by `want` replies.
    async fn packed(&self, want: usize, pipe: &Pipeline) -> RedisResult<Vec<Value>> {
        let bytes = pipe.get_packed_pipeline();
        self.many(want, |b| b.extend_from_slice(&bytes)).await
    }

    async fn many(&self, want: usize, write: impl Fn(&mut Vec<u8>)) -> RedisResult<Vec<Value>> {
        if want == 0 {
            return Ok(Vec::new());
        }
        match self.exchange(want, write).await? {
            Reply::One(v) => Ok(vec![v]),
            Reply::Many(v) => Ok(v),
        }
    }

    /// Writes what `write` writes, answered by `want` replies, and waits for them. A
    /// link found gone before writing is opened again first. Left before the replies
    /// came, it tells the link (which ends if it has gone silent).
    async fn exchange(&self, want: usize, write: impl Fn(&mut Vec<u8>)) -> RedisResult<Reply> {
        let sent = {
            let link = self
                .shared
                .link
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            link.as_ref().map(|l| (l.send(want, &write), l.clone()))
        };
        let (rx, reads, link) = match sent {
            Some((Ok((rx, reads)), link)) => (rx, reads, link),
            // Nothing was written: the command goes on a new link.
            _ => {
                let link = Box::pin(self.reopen()).await?;
                let (rx, reads) = link.send(want, &write)?;
                (rx, reads, link)
            }
        };
        let waiting = OnDrop::new(|| link.gave_up(reads));
        let answer = rx.await;
        waiting.disarm();
        answer.unwrap_or_else(|_| Err(dropped("the connection ended before its reply came")))
    }

    /// The link in place if it is open, else a new one (opened once for every call
    /// that waited meanwhile; a failed attempt is the error of each of them).
    async fn reopen(&self) -> RedisResult<Arc<Link>> {
        let seen = self.shared.attempts.load(Ordering::Acquire);
        let mut failed = self.shared.opening.lock().await;
        if let Some(link) = self.open_link() {
            return Ok(link);
        }
        if let Some(e) = &*failed
            && self.shared.attempts.load(Ordering::Acquire) != seen
        {
            return Err(e.clone());
        }
        let made = self.shared.opener.open().await;
        *failed = made.as_ref().err().cloned();
        self.shared.attempts.fetch_add(1, Ordering::Release);
        let link = made?;
        let old = self
            .shared
            .link
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(link.clone());
        if let Some(old) = old {
            old.close();
        }
        Ok(link)
    }

    fn open_link(&self) -> Option<Arc<Link>> {
        let link = self
            .shared
            .link
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        link.as_ref().filter(|l| !l.has_ended()).cloned()
    }
}

impl ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // Its reply as it came: redis-rs's callers read an error reply themselves.
        Box::pin(self.one(|b| cmd.write_packed_command(b)))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut replies = self.packed(offset + count, pipe).await?;
            replies.drain(..offset.min(replies.len()));
            Ok(replies)
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.opener.db
    }
}
