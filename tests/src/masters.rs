//! [`RedisMasters`]: several independent `redis-server` processes, started
//! in parallel (the setting of Redlock-style algorithms).

use std::ops::{Deref, DerefMut};

use crate::RedisServer;
use crate::server::{default_bin, start_parallel};

/// `n` independent [`RedisServer`]s (no replication, no cluster), each on
/// its own port and temp dir, started in parallel.
///
/// It dereferences to `[RedisServer]`, so a single node is reached by index
/// and failures are injected per node with the [`RedisServer`] methods:
/// `masters[1].kill()`, `masters[1].restart()` (same port),
/// `masters[2].pause()` / `masters[2].resume()`. Dropping it kills every
/// process.
///
/// ```
/// use lock_tests::RedisMasters;
///
/// let mut masters = RedisMasters::start(3);
/// assert_eq!(masters.urls().len(), 3);
/// masters[0].kill();
/// masters[0].restart();
/// ```
#[derive(Debug)]
pub struct RedisMasters {
    servers: Vec<RedisServer>,
}

impl RedisMasters {
    /// Starts `count` servers like [`RedisServer::start`], in parallel, and
    /// waits until every one answers `PING`.
    ///
    /// # Panics
    ///
    /// If any server does not come up (the message names its port and
    /// includes its log); the ones that did come up are killed.
    pub fn start(count: usize) -> RedisMasters {
        Self::start_with_args(count, &[])
    }

    /// Like [`start`](Self::start), passing the same extra arguments to
    /// every server (see [`RedisServer::start_with_args`]).
    pub fn start_with_args(count: usize, args: &[&str]) -> RedisMasters {
        let bin = default_bin();
        let servers = start_parallel(count, |_| RedisServer::start_with(&bin, args));
        RedisMasters { servers }
    }

    /// `redis://127.0.0.1:PORT/` of every server, in index order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// A client per server, in index order.
    pub fn clients(&self) -> Vec<redis::Client> {
        self.servers.iter().map(RedisServer::client).collect()
    }

    /// The servers themselves, to move them elsewhere.
    pub fn into_vec(self) -> Vec<RedisServer> {
        self.servers
    }
}

impl Deref for RedisMasters {
    type Target = [RedisServer];

    fn deref(&self) -> &[RedisServer] {
        &self.servers
    }
}

impl DerefMut for RedisMasters {
    fn deref_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }
}
