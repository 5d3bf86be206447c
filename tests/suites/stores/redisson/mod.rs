//! Redisson's layout on Redis: a Java contender made by hand as Redisson (4.7) makes
//! one (its scripts below, written from Redisson's protocol: the hash of
//! `<uuid>:<thread id>` fields, the unlock latch, the fair queue and deadlines, the
//! read-write hash with its `mode` and per-hold timeout keys) excludes and is excluded
//! by ours, and each one's unlock wakes the other's waiter: for the lock, the fair lock
//! and the read-write lock.

mod fair;
mod grants;
mod lease;
mod lock;
mod read_write;

use std::time::Duration;

use lock_core::{LockClient, LockConfig, LockOptions, RedissonLocks};
use lock_tests::RedisServer;
use redis::aio::MultiplexedConnection;

// What a Java waiter receives: a raw subscriber to the lock's channel.
use crate::common::{Listener, steady_backoff};

/// Our locks on `server`, with a backoff so slow (10 s) that a waiter granted within
/// 5 s of a release was woken by its message.
async fn locks(server: &RedisServer) -> RedissonLocks {
    RedissonLocks::new(&client(server).await)
}

/// The client under [`locks`].
async fn client(server: &RedisServer) -> LockClient {
    let slow = steady_backoff(Duration::from_secs(10));
    let config = LockConfig::new().with_backoff(slow);
    LockClient::open_with_config(server.url().as_str(), config)
        .await
        .unwrap()
}

/// Every kind of hold our Redisson locks take, by name.
fn every_kind() -> [(&'static str, LockOptions); 4] {
    [
        ("plain", LockOptions::new()),
        ("fair", LockOptions::new().fair()),
        ("read", LockOptions::new().read()),
        ("write", LockOptions::new().write()),
    ]
}

/// Redisson's `RLock` acquire: nil when taken (or re-entered), else the lock's PTTL.
const LOCK: &str = r"
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
return redis.call('pttl', KEYS[1])";

/// Redisson's `RLock` unlock, with the unlock latch (3.24+).
const UNLOCK: &str = r"
local done = redis.call('get', KEYS[3])
if done ~= false then return tonumber(done) end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[3], -1)
if left > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[5])
  return 0
end
redis.call('del', KEYS[1])
redis.call(ARGV[4], KEYS[2], ARGV[1])
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1";

/// Redisson's `RFairLock` acquire, waiting variant: KEYS name, queue, timeouts; ARGV
/// lease, field, wait, now (the client's clock).
const FAIR_LOCK: &str = r"
while true do
  local head = redis.call('lindex', KEYS[2], 0)
  if head == false then break end
  local deadline = tonumber(redis.call('zscore', KEYS[3], head))
  if deadline ~= nil and deadline > tonumber(ARGV[4]) then break end
  redis.call('zrem', KEYS[3], head)
  redis.call('lpop', KEYS[2])
end
if redis.call('exists', KEYS[1]) == 0 and (redis.call('exists', KEYS[2]) == 0
    or redis.call('lindex', KEYS[2], 0) == ARGV[2]) then
  redis.call('lpop', KEYS[2])
  redis.call('zrem', KEYS[3], ARGV[2])
  for _, waiter in ipairs(redis.call('zrange', KEYS[3], 0, -1)) do
    redis.call('zincrby', KEYS[3], -tonumber(ARGV[3]), waiter)
  end
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if redis.call('zscore', KEYS[3], ARGV[2]) ~= false then
  return math.max(0, redis.call('pttl', KEYS[1]))
end
local last = redis.call('lindex', KEYS[2], -1)
local ttl
if last ~= false and last ~= ARGV[2] and redis.call('zscore', KEYS[3], last) ~= false then
  ttl = tonumber(redis.call('zscore', KEYS[3], last)) - tonumber(ARGV[4])
else
  ttl = redis.call('pttl', KEYS[1])
end
if redis.call('zadd', KEYS[3], ttl + tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[2]) == 1 then
  redis.call('rpush', KEYS[2], ARGV[2])
end
return ttl";

/// Redisson's `RFairLock` unlock: KEYS name, queue, timeouts, channel, latch; ARGV 0,
/// lease, field, now, publish command, latch life.
const FAIR_UNLOCK: &str = r"
local done = redis.call('get', KEYS[5])
if done ~= false then return tonumber(done) end
while true do
  local head = redis.call('lindex', KEYS[2], 0)
  if head == false then break end
  local deadline = tonumber(redis.call('zscore', KEYS[3], head))
  if deadline ~= nil and deadline > tonumber(ARGV[4]) then break end
  redis.call('zrem', KEYS[3], head)
  redis.call('lpop', KEYS[2])
end
if redis.call('exists', KEYS[1]) == 0 then
  local head = redis.call('lindex', KEYS[2], 0)
  if head ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1]) end
  redis.call('set', KEYS[5], 1, 'px', ARGV[6])
  return 1
end
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
if redis.call('hincrby', KEYS[1], ARGV[3], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[5], 0, 'px', ARGV[6])
  return 0
end
redis.call('del', KEYS[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[6])
local head = redis.call('lindex', KEYS[2], 0)
if head ~= false then redis.call(ARGV[5], KEYS[4] .. ':' .. head, ARGV[1]) end
return 1";

/// Redisson's read lock acquire: KEYS name, this reader's timeout prefix; ARGV lease,
/// field, the same thread's writer field.
const READ_LOCK: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'read')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('set', KEYS[2] .. ':1', 1)
  redis.call('pexpire', KEYS[2] .. ':1', ARGV[1])
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'read' or (mode == 'write' and redis.call('hexists', KEYS[1], ARGV[3]) == 1) then
  local n = redis.call('hincrby', KEYS[1], ARGV[2], 1)
  local key = KEYS[2] .. ':' .. n
  redis.call('set', key, 1)
  redis.call('pexpire', key, ARGV[1])
  redis.call('pexpire', KEYS[1], math.max(redis.call('pttl', KEYS[1]), tonumber(ARGV[1])))
  return nil
end
return redis.call('pttl', KEYS[1])";

/// Redisson's read unlock: KEYS name, channel, this reader's timeout prefix, the key
/// prefix, latch; ARGV 0, field, publish command, latch life.
const READ_UNLOCK: &str = r"
local done = redis.call('get', KEYS[5])
if done ~= false then return tonumber(done) end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[3], KEYS[2], ARGV[1])
  redis.call('set', KEYS[5], 1, 'px', ARGV[4])
  return nil
end
if redis.call('hexists', KEYS[1], ARGV[2]) == 0 then return nil end
local left = redis.call('hincrby', KEYS[1], ARGV[2], -1)
if left == 0 then redis.call('hdel', KEYS[1], ARGV[2]) end
redis.call('del', KEYS[3] .. ':' .. (left + 1))
if redis.call('hlen', KEYS[1]) > 1 then
  local longest = -3
  for _, holder in ipairs(redis.call('hkeys', KEYS[1])) do
    local count = tonumber(redis.call('hget', KEYS[1], holder))
    if type(count) == 'number' then
      for i = count, 1, -1 do
        longest = math.max(longest, redis.call('pttl', KEYS[4] .. ':' .. holder .. ':rwlock_timeout:' .. i))
      end
    end
  end
  if longest > 0 then
    redis.call('pexpire', KEYS[1], longest)
    redis.call('set', KEYS[5], 0, 'px', ARGV[4])
    return 0
  end
  if mode == 'write' then
    redis.call('set', KEYS[5], 0, 'px', ARGV[4])
    return 0
  end
end
redis.call('del', KEYS[1])
redis.call(ARGV[3], KEYS[2], ARGV[1])
redis.call('set', KEYS[5], 1, 'px', ARGV[4])
return 1";

/// Redisson's write lock acquire: KEYS name; ARGV lease, writer field.
const WRITE_LOCK: &str = r"
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call('hset', KEYS[1], 'mode', 'write')
  redis.call('hset', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], ARGV[1])
  return nil
end
if mode == 'write' and redis.call('hexists', KEYS[1], ARGV[2]) == 1 then
  redis.call('hincrby', KEYS[1], ARGV[2], 1)
  redis.call('pexpire', KEYS[1], redis.call('pttl', KEYS[1]) + tonumber(ARGV[1]))
  return nil
end
return redis.call('pttl', KEYS[1])";

/// Redisson's write unlock: KEYS name, channel, latch; ARGV 1, lease, writer field,
/// publish command, latch life.
const WRITE_UNLOCK: &str = r"
local done = redis.call('get', KEYS[3])
if done ~= false then return tonumber(done) end
local mode = redis.call('hget', KEYS[1], 'mode')
if mode == false then
  redis.call(ARGV[4], KEYS[2], ARGV[1])
  redis.call('set', KEYS[3], 1, 'px', ARGV[5])
  return nil
end
if mode ~= 'write' or redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end
if redis.call('hincrby', KEYS[1], ARGV[3], -1) > 0 then
  redis.call('pexpire', KEYS[1], ARGV[2])
  redis.call('set', KEYS[3], 0, 'px', ARGV[5])
  return 0
end
redis.call('hdel', KEYS[1], ARGV[3])
if redis.call('hlen', KEYS[1]) == 1 then
  redis.call('del', KEYS[1])
  redis.call(ARGV[4], KEYS[2], ARGV[1])
else
  redis.call('hset', KEYS[1], 'mode', 'read')
end
redis.call('set', KEYS[3], 1, 'px', ARGV[5])
return 1";

/// Redisson's watchdog lease, which its scripts are sent with.
const LEASE_MS: u64 = 30_000;
/// How long an unlock's latch lives (Redisson: about 16 to 20 s).
const LATCH_MS: u64 = 18_000;

/// A Java service's Redisson client: its UUID, one connection, and its threads by id.
struct Java {
    conn: MultiplexedConnection,
    uuid: &'static str,
    requests: u64,
}

impl Java {
    async fn new(server: &RedisServer) -> Self {
        Self {
            conn: server.connection().await,
            uuid: "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            requests: 0,
        }
    }

    fn field(&self, thread: u64) -> String {
        format!("{}:{thread}", self.uuid)
    }

    /// A fresh unlock request id's latch key for `name`.
    fn latch(&mut self, name: &str) -> String {
        self.requests += 1;
        format!("redisson_unlock_latch:{{{name}}}:{:032x}", self.requests)
    }

    async fn run(&mut self, script: &str, keys: &[String], args: &[String]) -> Option<i64> {
        let script = redis::Script::new(script);
        let mut invocation = script.prepare_invoke();
        for k in keys {
            invocation.key(k);
        }
        for a in args {
            invocation.arg(a);
        }
        invocation.invoke_async(&mut self.conn).await.unwrap()
    }

    /// `getLock(name).tryLock()` on `thread`: `None` taken, else the holder's PTTL.
    async fn lock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let args = [LEASE_MS.to_string(), self.field(thread)];
        self.run(LOCK, &[name.into()], &args).await
    }

    /// `getLock(name).unlock()` on `thread`: 1 unlocked, 0 still held, `None` not ours.
    async fn unlock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let keys = [
            name.to_owned(),
            format!("redisson_lock__channel:{{{name}}}"),
            self.latch(name),
        ];
        let args = [
            "0".into(),
            LEASE_MS.to_string(),
            self.field(thread),
            "PUBLISH".into(),
            LATCH_MS.to_string(),
        ];
        self.run(UNLOCK, &keys, &args).await
    }

    fn fair_keys(name: &str) -> [String; 3] {
        [
            name.to_owned(),
            format!("redisson_lock_queue:{{{name}}}"),
            format!("redisson_lock_timeout:{{{name}}}"),
        ]
    }

    /// `getFairLock(name).tryLock(wait, ...)` attempt on `thread`: `None` taken, else
    /// how long to wait (the thread queues).
    async fn fair_lock(&mut self, name: &str, thread: u64, wait: Duration) -> Option<i64> {
        let args = [
            LEASE_MS.to_string(),
            self.field(thread),
            wait.as_millis().to_string(),
            now_ms().to_string(),
        ];
        self.run(FAIR_LOCK, &Self::fair_keys(name), &args).await
    }

    async fn fair_unlock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let [lock, queue, timeouts] = Self::fair_keys(name);
        let keys = [
            lock,
            queue,
            timeouts,
            format!("redisson_lock__channel:{{{name}}}"),
            self.latch(name),
        ];
        let args = [
            "0".into(),
            LEASE_MS.to_string(),
            self.field(thread),
            now_ms().to_string(),
            "PUBLISH".into(),
            LATCH_MS.to_string(),
        ];
        self.run(FAIR_UNLOCK, &keys, &args).await
    }

    fn timeout_prefix(&self, name: &str, thread: u64) -> String {
        format!("{{{name}}}:{}:rwlock_timeout", self.field(thread))
    }

    async fn read_lock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let keys = [name.to_owned(), self.timeout_prefix(name, thread)];
        let field = self.field(thread);
        let args = [
            LEASE_MS.to_string(),
            field.clone(),
            format!("{field}:write"),
        ];
        self.run(READ_LOCK, &keys, &args).await
    }

    async fn read_unlock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let keys = [
            name.to_owned(),
            format!("redisson_rwlock:{{{name}}}"),
            self.timeout_prefix(name, thread),
            format!("{{{name}}}"),
            self.latch(name),
        ];
        let args = [
            "0".into(),
            self.field(thread),
            "PUBLISH".into(),
            LATCH_MS.to_string(),
        ];
        self.run(READ_UNLOCK, &keys, &args).await
    }

    async fn write_lock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let args = [
            LEASE_MS.to_string(),
            format!("{}:write", self.field(thread)),
        ];
        self.run(WRITE_LOCK, &[name.into()], &args).await
    }

    async fn write_unlock(&mut self, name: &str, thread: u64) -> Option<i64> {
        let keys = [
            name.to_owned(),
            format!("redisson_rwlock:{{{name}}}"),
            self.latch(name),
        ];
        let args = [
            "1".into(),
            LEASE_MS.to_string(),
            format!("{}:write", self.field(thread)),
            "PUBLISH".into(),
            LATCH_MS.to_string(),
        ];
        self.run(WRITE_UNLOCK, &keys, &args).await
    }
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The fields of the hash `name`, with their values.
async fn hash(server: &RedisServer, name: &str) -> Vec<(String, String)> {
    let mut c = server.connection().await;
    let mut all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(name)
        .query_async(&mut c)
        .await
        .unwrap();
    all.sort();
    all
}
