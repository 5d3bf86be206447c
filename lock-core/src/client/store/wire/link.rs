//! One open connection to a Redis node: callers write their commands into its outbox
//! and wait for their replies; a writer task sends what the outbox holds, a reader
//! task parses the replies and hands them out in order.
//!
//! Replies come back in the order commands were written, so a command's place in the
//! line of callers waiting for replies is taken under the same lock as its bytes'
//! place in the outbox: the two orders are one. Whatever ends the link (the server
//! closes it, a read or write fails, the stream is not RESP, the runtime its tasks run
//! on ends, its `Wire` is dropped) fails every caller still waiting, and every later
//! send, with the same error; its `Wire` opens a new link for the next call.
//!
//! A peer that stops reading (a paused server, a silent network) would leave every
//! later call's bytes in the outbox until TCP gave up, which it may never do: a write
//! that has not finished within the link's stall limit ends the link instead, so its
//! buffers go with it. A path that goes silent while a link's few bytes still fit in
//! the sockets' buffers would leave every call timing out until TCP gave up (minutes),
//! even where a new connection gets through: a link that read nothing for its stall
//! limit while replies were owed (told by its callers giving up, [`Link::gave_up`])
//! ends too, and the next call opens a new one.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Poll;
use std::time::{Duration, Instant};

use redis::{RedisError, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Notify, oneshot};
use tokio::task::AbortHandle;

use super::resp;

/// What a caller waits for: its one reply, or the replies of its pipeline.
pub(super) type Answer = Result<Reply, RedisError>;

pub(super) enum Reply {
    One(Value),
    Many(Vec<Value>),
}

/// A caller whose replies are all in, to hand them to outside the outbox's lock.
type Done = (Option<Waiting>, Reply);

/// A caller waiting for `want` replies (more than one: a pipeline's, gathered in `got`).
struct Waiting {
    want: usize,
    got: Vec<Value>,
    tx: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Outbox {
    /// Bytes not yet taken by the writer.
    bytes: Vec<u8>,
    /// Callers waiting for replies, in the order their commands were written.
    waiting: VecDeque<Waiting>,
    /// Why the link ended; it fails every later send.
    ended: Option<RedisError>,
    /// A caller gave up waiting with nothing read since it wrote: the count of reads
    /// then, and when.
    quiet: Option<(u64, Instant)>,
}

pub(super) struct Link {
    outbox: Mutex<Outbox>,
    /// Wakes the writer: there are bytes to send, or the link ended.
    to_write: Notify,
    tasks: Mutex<Vec<AbortHandle>>,
    /// Reads that brought bytes, so far.
    reads: AtomicU64,
    /// How long one write may take, and how long replies may be owed with nothing read.
    stall: Duration,
}

impl Link {
    /// A link over `reader` and `writer`, its tasks spawned on the current runtime;
    /// `stall`: how long one write may take, or replies be owed with nothing read,
    /// before the link ends.
    pub(super) fn start<R, W>(reader: R, writer: W, rest: Vec<u8>, stall: Duration) -> Arc<Self>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let link = Arc::new(Self {
            outbox: Mutex::default(),
            to_write: Notify::new(),
            tasks: Mutex::default(),
            reads: AtomicU64::new(0),
            stall,
        });
        // Each task owns its `EndOnDrop` from the start: a task dropped before its first
        // poll (its runtime ended at once) still ends the link.
        let read = tokio::spawn(read(EndOnDrop(link.clone()), reader, rest));
        let write = tokio::spawn(write(EndOnDrop(link.clone()), writer, stall));
        *link.tasks.lock().unwrap_or_else(PoisonError::into_inner) =
            vec![read.abort_handle(), write.abort_handle()];
        link
    }

    fn outbox(&self) -> MutexGuard<'_, Outbox> {
        // Nothing under this lock can panic half-way through a change.
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the link has ended.
    pub(super) fn has_ended(&self) -> bool {
        self.outbox().ended.is_some()
    }

    /// Writes a command (or `want` of them) with `write` into the outbox: the receiver
    /// of its reply and the count of reads so far (for [`gave_up`](Self::gave_up)), or
    /// the error the link ended with.
    pub(super) fn send(
        &self,
        want: usize,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<(oneshot::Receiver<Answer>, u64), RedisError> {
        let (tx, rx) = oneshot::channel();
        let reads;
        let wake = {
            let mut out = self.outbox();
            if let Some(e) = &out.ended {
                return Err(e.clone());
            }
            let idle = out.bytes.is_empty();
            reads = self.reads.load(Ordering::Acquire);
            write(&mut out.bytes);
            out.waiting.push_back(Waiting {
                want,
                got: Vec::new(),
                tx,
            });
            idle
        };
        if wake {
            self.to_write.notify_one();
        }
        Ok((rx, reads))
    }

    /// A caller stopped waiting for the reply to what it sent when `reads` reads had
    /// been made (its time was up, or it was cancelled). Nothing read since, and
    /// nothing since another caller gave up at least the stall limit ago: replies were
    /// owed all that time and none came, so the link ends.
    pub(super) fn gave_up(&self, reads: u64) {
        if self.reads.load(Ordering::Acquire) != reads {
            return;
        }
        let silent = {
            let mut out = self.outbox();
            match out.quiet {
                Some((at, since)) if at == reads => since.elapsed() >= self.stall,
                _ => {
                    out.quiet = Some((reads, Instant::now()));
                    false
                }
            }
        };
        if silent {
            self.end(dropped(format!(
                "Redis answered nothing for {:?} while replies were owed (a silent network \
                 or a stuck server): the connection is dropped",
                self.stall
            )));
        }
    }

    /// Ends the link with `e` (the first reason stays): every caller waiting gets it.
    pub(super) fn end(&self, e: RedisError) {
        let waiting = {
            let mut out = self.outbox();
            if out.ended.is_some() {
                return;
            }
            out.ended = Some(e.clone());
            out.bytes = Vec::new();
            std::mem::take(&mut out.waiting)
        };
        self.to_write.notify_one();
        for w in waiting {
            let _ = w.tx.send(Err(e.clone()));
        }
    }

    /// Ends the link and stops its tasks (its `Wire` is gone or replaced it).
    pub(super) fn close(&self) {
        self.end(dropped("the connection was closed by its client"));
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            task.abort();
        }
    }

    /// Hands `replies`, in order, to the callers waiting for them; `done` is the
    /// reader's scratch space, kept so a delivery allocates nothing.
    fn deliver(&self, replies: &mut Vec<Value>, done: &mut Vec<Done>) -> Result<(), RedisError> {
        let unasked = {
            let mut out = self.outbox();
            let mut unasked = false;
            for v in replies.drain(..) {
                let Some(w) = out.waiting.front_mut() else {
                    unasked = true;
                    break;
                };
                if w.want == 1 {
                    done.push((out.waiting.pop_front(), Reply::One(v)));
                    continue;
                }
                if w.got.is_empty() {
                    w.got.reserve_exact(w.want);
                }
                w.got.push(v);
                if w.got.len() == w.want {
                    let mut w = out.waiting.pop_front();
                    let got = w.as_mut().map(|w| std::mem::take(&mut w.got));
                    done.push((w, Reply::Many(got.unwrap_or_default())));
                }
            }
            unasked
        };
        if unasked {
            // Dropped outside the lock, as the senders are below.
            done.clear();
            return Err(dropped("Redis sent a reply no command asked for"));
        }
        for (w, reply) in done.drain(..) {
            if let Some(w) = w {
                // A caller that stopped waiting (a timeout) leaves its reply unread.
                let _ = w.tx.send(Ok(reply));
            }
        }
        Ok(())
    }
}

/// A connection error: the link is gone, and whether a command on it ran is unknown (a
/// call that failed so counts as one Redis did not answer).
pub(crate) fn dropped(why: impl Into<String>) -> RedisError {
    std::io::Error::new(std::io::ErrorKind::ConnectionReset, why.into()).into()
}

/// Ends its link when its task ends, whatever the way (its runtime shut down, say).
struct EndOnDrop(Arc<Link>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.0.end(dropped(
            "the connection's task ended (its runtime shut down)",
        ));
    }
}

/// The reader: parses replies as they arrive (starting with `rest`, read during the
/// handshake) and hands them out.
async fn read(link: EndOnDrop, mut reader: impl AsyncRead + Unpin, rest: Vec<u8>) {
    let mut buf = rest;
    buf.reserve(16 * 1024);
    let (mut parsed, mut done) = (Vec::new(), Vec::new());
    let mut start = 0;
    loop {
        loop {
            match resp::parse(&buf[start..]) {
                Ok(Some((v, n))) => {
                    parsed.push(v);
                    start += n;
                }
                Ok(None) => break,
                Err(e) => return link.0.end(e),
            }
        }
        if !parsed.is_empty()
            && let Err(e) = link.0.deliver(&mut parsed, &mut done)
        {
            return link.0.end(e);
        }
        if start == buf.len() {
            // A large reply's room is not kept once it is handed out.
            if buf.capacity() > KEPT_CAPACITY {
                buf = Vec::new();
            } else {
                buf.clear();
            }
            start = 0;
        } else if start > 0 && buf.capacity() - buf.len() < 4096 {
            buf.drain(..start);
            start = 0;
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        match reader.read_buf(&mut buf).await {
            Ok(0) => return link.0.end(dropped("Redis closed the connection")),
            Ok(_) => {
                link.0.reads.fetch_add(1, Ordering::Release);
            }
            Err(e) => return link.0.end(e.into()),
        }
    }
}

/// A buffer grown past this (a burst of commands, a large reply) is not kept.
const KEPT_CAPACITY: usize = 256 * 1024;

/// The writer: sends what the outbox holds, all of it in one write when it can; ends
/// the link if one write takes longer than `stall`.
async fn write(link: EndOnDrop, mut writer: impl AsyncWrite + Unpin, stall: Duration) {
    let mut sending = Vec::new();
    loop {
        {
            let mut out = link.0.outbox();
            if out.ended.is_some() {
                return;
            }
            std::mem::swap(&mut out.bytes, &mut sending);
        }
        if sending.is_empty() {
            // A notification sent since the outbox was read is kept for this wait.
            link.0.to_write.notified().await;
            continue;
        }
        let mut written = pin!(writer.write_all(&sending));
        // Most writes finish at once: only one that waits for the peer gets a timer.
        let done = std::future::poll_fn(|cx| match written.as_mut().poll(cx) {
            Poll::Ready(r) => Poll::Ready(Some(r)),
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        let done = match done {
            Some(r) => r,
            None => match tokio::time::timeout(stall, written).await {
                Ok(r) => r,
                Err(_) => {
                    return link.0.end(dropped(format!(
                        "Redis read nothing of a write for {stall:?} (a paused server or a \
                         silent network): the connection is dropped"
                    )));
                }
            },
        };
        if let Err(e) = done {
            return link.0.end(e.into());
        }
        sending.clear();
        if sending.capacity() > KEPT_CAPACITY {
            sending = Vec::new();
        }
    }
}
