#!lua
-- redisson_lock.lua: a lock (plain or fair) in Redisson's layout, so Java services on
-- Redisson's RLock / RFairLock and Rust services on this crate exclude each other and
-- wake each other's waiters. The lock is a hash at the lock's name: holder field
-- '<client uuid>:<thread id>' -> hold count, the lease as the key's expiry. A fair
-- lock adds a list of waiting fields and a sorted set of their deadlines (ms since the
-- epoch: Redisson's clients write their own clock, this script the server's).
--
-- Beyond Redisson: a grant leaves evidence (KEYS[3]) that lasts its lease and is renewed
-- with it, so that undoing an acquisition whose reply was lost decrements only a hold it
-- really took, and a grant whose lease ran out is neither given back, renewed nor
-- fenced (by then the field may count a newer grant of the same thread); a lock hash
-- with a 'mode' field is a read-write lock's, never re-entered as a plain lock.
--
-- KEYS[1]  the lock (the name itself)
-- KEYS[2]  the unlock latch of this release: 'redisson_unlock_latch:{<name>}:<request>'
-- KEYS[3]  the grant's evidence: 'redisson_lock_grant:{<name>}:<request>'
-- KEYS[4]  the fencing counter: 'redisson_lock_token:{<name>}'
-- KEYS[5]  the fair lock's queue: 'redisson_lock_queue:{<name>}'
-- KEYS[6]  the fair lock's deadlines: 'redisson_lock_timeout:{<name>}'
-- ARGV[1]  'acquire', 'release', 'undo', 'renew', 'fence' or 'leave'
-- ARGV[2]  the holder's field
-- ARGV[3]  the channel: 'redisson_lock__channel:{<name>}' (a fair waiter's is
--          '<channel>:<field>')
-- ARGV[4]  'fair' or 'plain'
-- ARGV[5]  lease (ms): acquire, renew; the latch's life (ms): release, undo; the wait
--          time (ms) the waiter was queued with: leave
-- acquire:
-- ARGV[6]  1 to take the grant's fencing token with it, 0 not to
-- ARGV[7]  the fair wait (ms): how far past the place before it a new place lapses
--          (Redisson's fairLockWaitTimeout)
-- ARGV[8]  1 when the caller waits, 0 when it does not (it takes a free lock only if
--          nobody queues before it, and takes no place)
--
-- Returns:
--   {1, token}  acquire: granted (token 0 when not asked for); fence: the new token;
--               release and undo: the hold was given back (undo also when it was never
--               taken); renew: the lease is at least lease ms from now; leave: done
--   {0, ms}     acquire: busy; ask again within ms (-1: the lock has no expiry)
--   {-1, 0}     release, renew, fence: the lock is gone, or this grant's lease ran out
--   {-2, 0}     release, renew, fence: another holder has it
local lock, latch, evidence, fence, queue, deadlines = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local action, field, channel, fair = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == 'fair'

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- A message both kinds of Redisson subscriber hear: PUBLISH (a node, and this
-- crate's waiters) and SPUBLISH (Redisson's sharded pub/sub on a Cluster).
local function publish(to, message)
  -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
  redis.pcall('PUBLISH', to, message)
  redis.pcall('SPUBLISH', to, message)
end

-- Forgets the waiters at the head of the queue whose place lapsed.
local function drop_lapsed()
  while true do
    local head = redis.call('LINDEX', queue, 0)
    if not head then
      return
    end
    local deadline = tonumber(redis.call('ZSCORE', deadlines, head))
    if deadline and deadline > now then
      return
    end
    redis.call('ZREM', deadlines, head)
    redis.call('LPOP', queue)
  end
end

-- Tells the head of the queue that the lock is free (its own channel).
local function wake_head()
  local head = redis.call('LINDEX', queue, 0)
  if head then
    publish(channel .. ':' .. head, '0')
  end
end

-- Why a hold of this grant is not there: its lease ran out (`granted` false: its
-- evidence went with it) or the lock is gone, or another has it.
local function missing(granted)
  if not granted or redis.call('EXISTS', lock) == 0 then
    return {-1, 0}
  end
  return {-2, 0}
end

-- Whether `field` may re-enter: it holds the lock, and the lock is no read-write lock.
local function holds()
  return redis.call('HEXISTS', lock, field) == 1 and redis.call('HEXISTS', lock, 'mode') == 0
end

-- Makes the lock last at least `lease` ms more, never less: grants of one field share
-- the key's expiry (one may still be on its way while the next is taken), and each
-- counts on the lease it was told.
local function last(key, lease)
  if redis.call('PTTL', key) < tonumber(lease) then
    redis.call('PEXPIRE', key, lease)
  end
end

-- A busy answer from the holder's PTTL: ask again within it, at least 1 ms. -1 (a lock
-- without expiry, written by another program) is passed on: the client backs off.
local function busy(pttl)
  if pttl == -1 then
    return {0, -1}
  end
  return {0, math.max(pttl, 1)}
end

-- Whether this grant's lease still runs: its evidence lasts as long.
local function live()
  return redis.call('EXISTS', evidence) == 1
end

local function grant(lease)
  redis.call('HINCRBY', lock, field, 1)
  last(lock, lease)
  redis.call('SET', evidence, '1', 'PX', lease)
  if ARGV[6] == '1' then
    return {1, redis.call('INCR', fence)}
  end
  return {1, 0}
end

if action == 'acquire' then
  local lease = tonumber(ARGV[5])
  if not fair then
    if redis.call('EXISTS', lock) == 0 or holds() then
      return grant(lease)
    end
    return busy(redis.call('PTTL', lock))
  end
  local wait, waits = tonumber(ARGV[7]), ARGV[8] == '1'
  drop_lapsed()
  local head = redis.call('LINDEX', queue, 0)
  if redis.call('EXISTS', lock) == 0 and (not head or head == field) then
    if head then
      redis.call('LPOP', queue)
    end
    redis.call('ZREM', deadlines, field)
    -- Everyone behind moves up one place: each deadline comes one wait time closer.
    for _, waiter in ipairs(redis.call('ZRANGE', deadlines, 0, -1)) do
      redis.call('ZINCRBY', deadlines, -wait, waiter)
    end
    return grant(lease)
  end
  if holds() then
    return grant(lease)
  end
  if not waits then
    return busy(redis.call('PTTL', lock))
  end
  if redis.call('ZSCORE', deadlines, field) then
    local pttl = redis.call('PTTL', lock)
    if pttl > 0 or pttl == -1 then
      return busy(pttl)
    end
    -- Free, but another waiter heads the line: it has until its place lapses.
    local first = tonumber(redis.call('ZSCORE', deadlines, head) or now)
    return {0, math.max(first - now, 1)}
  end
  -- A new place at the end: it lapses one wait time after the place before it (or the
  -- holder's lease, when nobody queues).
  local last = redis.call('LINDEX', queue, -1)
  local ttl, answer
  if last and last ~= field then
    ttl = tonumber(redis.call('ZSCORE', deadlines, last)) - now
    answer = {0, math.max(ttl, 1)}
  else
    ttl = redis.call('PTTL', lock)
    answer = busy(ttl)
  end
  if redis.call('ZADD', deadlines, ttl + wait + now, field) == 1 then
    redis.call('RPUSH', queue, field)
  end
  return answer
end

if action == 'leave' then
  local wait = tonumber(ARGV[5])
  local line = redis.call('LRANGE', queue, 0, -1)
  local at = 0
  for i, waiter in ipairs(line) do
    if waiter == field then
      at = i
    end
  end
  if at > 0 then
    for i = at + 1, #line do
      redis.call('ZINCRBY', deadlines, -wait, line[i])
    end
    redis.call('LREM', queue, 0, field)
    redis.call('ZREM', deadlines, field)
    if at == 1 and redis.call('EXISTS', lock) == 0 then
      wake_head()
    end
  end
  return {1, 0}
end

if action == 'renew' then
  local granted = live()
  if granted and redis.call('HEXISTS', lock, field) == 1 then
    last(lock, ARGV[5])
    last(evidence, ARGV[5])
    return {1, 0}
  end
  return missing(granted)
end

if action == 'fence' then
  local granted = live()
  if granted and holds() then
    return {1, redis.call('INCR', fence)}
  end
  return missing(granted)
end

-- release, undo: give one hold back.
local done = redis.call('GET', latch)
if done then
  -- A release sent again (its reply was lost): answered as the first time.
  return {1, 0}
end
local granted = live()
if action == 'undo' and not granted then
  return {1, 0} -- never granted: nothing to give back
end
redis.call('DEL', evidence)
if fair then
  drop_lapsed()
end
-- Without evidence the grant's lease ran out: a hold in the field is a newer grant's.
if not granted or redis.call('HEXISTS', lock, field) == 0 then
  if fair and redis.call('EXISTS', lock) == 0 then
    wake_head()
  end
  return missing(granted)
end
if redis.call('HINCRBY', lock, field, -1) > 0 then
  redis.call('SET', latch, '0', 'PX', ARGV[5])
  return {1, 0}
end
redis.call('DEL', lock)
if fair then
  wake_head()
else
  publish(channel, '0')
end
redis.call('SET', latch, '1', 'PX', ARGV[5])
return {1, 0}
