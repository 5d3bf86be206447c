#!lua
-- redisson_read_write.lua: a read-write lock in Redisson's layout (RReadWriteLock), so
-- Java services on Redisson and Rust services on this crate share it. The lock is one
-- hash at its name: 'mode' -> 'read' or 'write', each reader's field
-- '<client uuid>:<thread id>' -> its hold count, the writer's field
-- '<client uuid>:<thread id>:write' -> its hold count; each read hold n of a reader has
-- a key '{<name>}:<field>:rwlock_timeout:<n>' expiring with its lease, and the hash
-- expires with the longest of them. A writer may take read holds beside its write hold
-- (a downgrade); readers are never held back by a waiting writer (as in Redisson).
--
-- Beyond Redisson: a grant leaves evidence (KEYS[3]) that lasts its lease and is renewed
-- with it, so that undoing an acquisition whose reply was lost gives back only a hold it
-- really took, and a hold whose lease ran out is neither given back, renewed nor fenced
-- (by then the field may count a newer hold of the same thread); a hash without 'mode'
-- is a plain lock's, never taken as a read-write lock.
--
-- KEYS[1]  the lock (the name itself)
-- KEYS[2]  the unlock latch of this release: 'redisson_unlock_latch:{<name>}:<request>'
-- KEYS[3]  the grant's evidence: 'redisson_lock_grant:{<name>}:<request>'
-- KEYS[4]  the fencing counter: 'redisson_lock_token:{<name>}'
-- KEYS[5]  this reader's hold keys' prefix: '{<name>}:<field>:rwlock_timeout'
-- KEYS[6]  the prefix of every holder's hold keys: '{<name>}'
-- ARGV[1]  'acquire', 'release', 'undo', 'renew' or 'fence'
-- ARGV[2]  'r' for a read hold, 'w' for the write hold
-- ARGV[3]  the holder's field '<client uuid>:<thread id>' (a writer's adds ':write')
-- ARGV[4]  the channel: 'redisson_rwlock:{<name>}'
-- ARGV[5]  lease (ms): acquire, renew; the latch's life (ms): release, undo
-- ARGV[6]  acquire: 1 to take a writer's fencing token with it, 0 not to
--
-- Returns:
--   {1, token}  acquire: granted (token 0 when not asked for, and for readers); fence:
--               the new token; release and undo: the hold was given back (undo also
--               when it was never taken); renew: the lease is at least lease ms from now
--   {0, ms}     acquire: busy; ask again within ms (-1: the lock has no expiry)
--   {-1, 0}     release, renew, fence: the lock is gone, or this grant's lease ran out
--   {-2, 0}     release, renew, fence: it is held, but not by this hold
local lock, latch, evidence, fence, mine, prefix = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local action, read, field, channel = ARGV[1], ARGV[2] == 'r', ARGV[3], ARGV[4]
local writer = field .. ':write'

local function publish(message)
  -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
  redis.pcall('PUBLISH', channel, message)
  redis.pcall('SPUBLISH', channel, message)
end

-- Makes `key` last at least `ms` more, never less: holds that share a key's expiry
-- each count on the lease they were told.
local function last(key, ms)
  if redis.call('PTTL', key) < tonumber(ms) then
    redis.call('PEXPIRE', key, ms)
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

-- Whether this hold's lease still runs: its evidence lasts as long.
local function live()
  return redis.call('EXISTS', evidence) == 1
end

-- Why a hold of this grant is not there: its lease ran out (`granted` false: its
-- evidence went with it) or the lock is gone, or another has it.
local function missing(granted)
  if not granted or redis.call('EXISTS', lock) == 0 then
    return {-1, 0}
  end
  return {-2, 0}
end

-- Every read hold's key of every holder, with `f` called on each.
local function each_hold(f)
  for _, holder in ipairs(redis.call('HKEYS', lock)) do
    local count = tonumber(redis.call('HGET', lock, holder))
    if count then
      for n = count, 1, -1 do
        f(prefix .. ':' .. holder .. ':rwlock_timeout:' .. n)
      end
    end
  end
end

local function granted(lease)
  redis.call('SET', evidence, '1', 'PX', lease)
  if not read and ARGV[6] == '1' then
    return {1, redis.call('INCR', fence)}
  end
  return {1, 0}
end

local mode = redis.call('HGET', lock, 'mode')

if action == 'acquire' then
  local lease = tonumber(ARGV[5])
  if not mode and redis.call('EXISTS', lock) == 1 then
    return busy(redis.call('PTTL', lock)) -- a plain lock of this name
  end
  if read then
    if not mode then
      redis.call('HSET', lock, 'mode', 'read', field, 1)
      redis.call('SET', mine .. ':1', '1', 'PX', lease)
      redis.call('PEXPIRE', lock, lease)
      return granted(lease)
    end
    if mode == 'read' or redis.call('HEXISTS', lock, writer) == 1 then
      local n = redis.call('HINCRBY', lock, field, 1)
      redis.call('SET', mine .. ':' .. n, '1', 'PX', lease)
      last(lock, lease)
      return granted(lease)
    end
  else
    if not mode then
      redis.call('HSET', lock, 'mode', 'write', writer, 1)
      redis.call('PEXPIRE', lock, lease)
      return granted(lease)
    end
    if mode == 'write' and redis.call('HEXISTS', lock, writer) == 1 then
      redis.call('HINCRBY', lock, writer, 1)
      redis.call('PEXPIRE', lock, redis.call('PTTL', lock) + lease)
      return granted(lease)
    end
  end
  return busy(redis.call('PTTL', lock))
end

if action == 'renew' then
  local granted = live()
  if not granted or redis.call('HEXISTS', lock, read and field or writer) == 0 then
    return missing(granted)
  end
  last(lock, ARGV[5])
  last(evidence, ARGV[5])
  if read then
    for n = tonumber(redis.call('HGET', lock, field)), 1, -1 do
      last(mine .. ':' .. n, ARGV[5])
    end
  end
  return {1, 0}
end

if action == 'fence' then
  local granted = live()
  if granted and mode == 'write' and redis.call('HEXISTS', lock, writer) == 1 then
    return {1, redis.call('INCR', fence)}
  end
  return missing(granted)
end

-- release, undo: give one hold back.
if redis.call('GET', latch) then
  return {1, 0} -- a release sent again (its reply was lost): answered as the first time
end
local granted = live()
if action == 'undo' and not granted then
  return {1, 0} -- never granted: nothing to give back
end
redis.call('DEL', evidence)
local life = ARGV[5]
if not mode then
  publish(read and '0' or '1') -- as Redisson: whoever waits looks again
  return {-1, 0}
end
if not granted then
  return missing(granted) -- a hold in the field now is a newer one's
end

if read then
  if redis.call('HEXISTS', lock, field) == 0 then
    return missing(granted)
  end
  local left = redis.call('HINCRBY', lock, field, -1)
  if left == 0 then
    redis.call('HDEL', lock, field)
  else
    -- The newest hold's key goes, whichever hold was given back: the ones left keep
    -- its lease if it was longer.
    last(mine .. ':' .. left, redis.call('PTTL', mine .. ':' .. (left + 1)))
  end
  redis.call('DEL', mine .. ':' .. (left + 1))
  redis.call('SET', latch, '1', 'PX', life)
  if redis.call('HLEN', lock) > 1 then
    -- Others hold on: the hash lasts as long as the longest of their read holds.
    local longest = -3
    each_hold(function(key) longest = math.max(longest, redis.call('PTTL', key)) end)
    if longest > 0 then
      if mode == 'write' then
        last(lock, longest) -- the writer's lease is the hash's own
      else
        redis.call('PEXPIRE', lock, longest)
      end
      return {1, 0}
    end
    if mode == 'write' then
      return {1, 0} -- the writer holds on
    end
  end
  redis.call('DEL', lock)
  publish('0')
  return {1, 0}
end

if mode ~= 'write' or redis.call('HEXISTS', lock, writer) == 0 then
  return missing(granted)
end
redis.call('SET', latch, '1', 'PX', life)
if redis.call('HINCRBY', lock, writer, -1) > 0 then
  return {1, 0}
end
redis.call('HDEL', lock, writer)
if redis.call('HLEN', lock) == 1 then
  redis.call('DEL', lock)
  publish('1')
else
  -- The writer's own read holds remain: the lock is a read lock now, open to readers.
  redis.call('HSET', lock, 'mode', 'read')
  publish('1')
end
return {1, 0}
