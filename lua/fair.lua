#!lua
-- fair.lua: a fair lock: the plain lock's key (a string holding the grant's value,
-- expiring with the lease, as acquire.lua writes it) granted in arrival order to the
-- waiters of a queue. A waiter's place lasts a place lease after its last attempt
-- (each attempt renews it), so a waiter that vanished without leaving holds the queue
-- up for at most that long. Deadlines are the server's clock, never a client's.
--
-- KEYS[1]  the lock
-- KEYS[2]  the queue: a list of waiting owners, the oldest first
-- KEYS[3]  the queue's deadlines: a sorted set, owner -> server time (ms) its place lapses
-- KEYS[4]  the waiter marker of the lock (a release publishes only while it exists)
-- KEYS[5]  the fencing counter of the lock's hash slot
-- ARGV[1]  the owner (client id and scope: the same for every attempt of one acquisition)
-- ARGV[2]  the release channel: the head of the queue is woken on '<channel>:<owner>'
-- ARGV[3]  the grant's value
-- ARGV[4]  lease in milliseconds
-- ARGV[5]  the place lease in milliseconds; 0 when the caller does not wait (it takes the
--          lock only if nobody queues before it, and leaves no place)
-- ARGV[6]  1 to take the grant's fencing token with it, 0 not to
--
-- A waiter leaves the line with fair_leave.lua, which only removes, so that a full
-- server (one that refuses this script) still runs it.
--
-- Returns:
--   {1, token}  granted; token is the grant's fencing token, 0 when not asked for
--   {0, ms}     not granted; ask again within ms (the holder's lease, or the place of
--               the waiter before us, whichever ends first)
local lock, queue, deadlines, waiters, fence = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, channel = ARGV[1], ARGV[2]

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Wakes the head of the queue when the lock is free: it is the only waiter that may take it.
local function wake_head()
  if redis.call('EXISTS', lock) == 0 then
    local head = redis.call('LINDEX', queue, 0)
    if head then
      -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
      redis.pcall('PUBLISH', channel .. ':' .. head, owner)
    end
  end
end

-- Waiters whose place lapsed are forgotten, wherever they stand.
local lapsed = redis.call('ZRANGEBYSCORE', deadlines, '-inf', now)
for _, gone in ipairs(lapsed) do
  redis.call('LREM', queue, 0, gone)
end
if #lapsed > 0 then
  redis.call('ZREMRANGEBYSCORE', deadlines, '-inf', now)
end

local value, lease, place = ARGV[3], ARGV[4], tonumber(ARGV[5])
local head = redis.call('LINDEX', queue, 0)
local pttl = redis.call('PTTL', lock)
if pttl == -2 and (not head or head == owner) then
  redis.call('SET', lock, value, 'PX', lease)
  if head then
    redis.call('LPOP', queue)
    redis.call('ZREM', deadlines, owner)
    if redis.call('EXISTS', queue) == 1 then
      -- The release that woke us took the mark: our release must wake the next head.
      redis.call('SET', waiters, '1', 'PX', tonumber(lease) + place)
    end
  end
  if ARGV[6] == '1' then
    return {1, redis.call('INCR', fence)}
  end
  return {1, 0}
end

if place > 0 then
  if redis.call('ZADD', deadlines, now + place, owner) == 1 then
    redis.call('RPUSH', queue, owner)
  end
  -- Both keys outlive the latest place in them, and no longer.
  for _, key in ipairs({queue, deadlines}) do
    if redis.call('PTTL', key) < place then
      redis.call('PEXPIRE', key, place)
    end
  end
  -- A release publishes only while the lock is marked as waited for.
  redis.call('SET', waiters, '1', 'PX', math.max(pttl, 0) + place)
  if #lapsed > 0 then
    -- The lapsed head may have been the one a release woke.
    wake_head()
  end
end

if pttl >= 0 then
  return {0, pttl}
end
if pttl == -1 then
  -- A key without expiry is no grant of ours: ask again after one place lease.
  return {0, math.max(place, 1)}
end
-- Free, but another waiter is first: it has until its place lapses.
local first = tonumber(redis.call('ZSCORE', deadlines, head) or now)
return {0, math.max(first - now, 1)}
