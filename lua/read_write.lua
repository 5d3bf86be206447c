#!lua
-- read_write.lua: a read-write lock. Its key is a hash of its holders: each holder's
-- grant value -> the server time (ms) its lease ends; the field '=w' names the writer's
-- grant value (a grant value has no '='). Many readers, or one writer and its own
-- scope's readers (a downgrade). The key's own expiry is the longest lease in it, so a
-- lock nobody gives back goes away by itself; a holder whose lease ended is dropped by
-- the next call that looks.
--
-- A writer that waits sets the lock's writer mark (for `linger` ms after each attempt:
-- as long as it still waits, at most the longest pause between its attempts) and new
-- readers wait while it is set: waiting writers are not starved by readers that keep
-- coming. A writer that stops waiting holds readers back at most `linger` ms.
--
-- Holds are extended by read_write_extend.lua and given back by read_write_release.lua,
-- which only overwrite or delete, so that a full server (one that refuses this script)
-- still runs them.
--
-- Entries are independent, one per call of the lock, and many go in one script call: a
-- batch of one is the plain call. Each gets its own reply, in order, as if called alone.
--
-- Entry i (i = 1 .. #KEYS / 3) uses KEYS[3i-2 .. 3i] and ARGV[4i-3 .. 4i]:
-- KEYS[3i-2]  the lock
-- KEYS[3i-1]  its writer mark
-- KEYS[3i]    its fencing counter (a write hold's token: a reader repeats the lock here)
-- ARGV[4i-3]  'r' or 'w': acquire a read or a write hold
-- ARGV[4i-2]  the grant's value
-- ARGV[4i-1]  the lease (ms)
-- ARGV[4i]    linger (ms): 0 when the caller does not wait
--
-- Returns one reply per entry (an array of them, or for a batch of one that reply alone):
--   {1, token}  granted (a reader's token is 0)
--   {0, ms}     busy for at most ms
--   {'error', message}  this entry failed (its key holds another type, or an unknown
--                       operation); the others stand
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- Each operation reads the lock first with `redis.pcall`: a key of another type fails
-- that entry alone, before it wrote anything.
local function acquire(lock, mark, fence, write, value, lease, linger)
  -- The live holders: how many, the earliest end, the writer and its end.
  local flat = redis.pcall('HGETALL', lock)
  if flat.err then
    return {'error', flat.err}
  end
  local live, earliest, writer = 0, nil, nil
  local ends = {}
  for i = 1, #flat, 2 do
    local field, v = flat[i], flat[i + 1]
    if field == '=w' then
      writer = v
    else
      local e = tonumber(v)
      if e <= now then
        redis.call('HDEL', lock, field)
      else
        live = live + 1
        ends[field] = e
        if not earliest or e < earliest then
          earliest = e
        end
      end
    end
  end
  if writer and not ends[writer] then
    redis.call('HDEL', lock, '=w')
    writer = nil
  end
  if write then
    if live > 0 then
      local wait = earliest - now
      if linger > 0 then
        -- Another waiting writer's longer mark stands.
        if redis.call('PTTL', mark) < linger then
          redis.call('SET', mark, '1', 'PX', linger)
        end
        wait = math.min(wait, math.floor(linger / 2))
      end
      return {0, wait}
    end
  elseif writer then
    -- Owners: a grant value is `<client>:<scope>:<grant>`.
    if string.match(writer, '^(.*):') ~= string.match(value, '^(.*):') then
      return {0, ends[writer] - now}
    end
  else
    local marked = redis.call('PTTL', mark)
    if marked > 0 then
      return {0, marked}
    end
  end
  redis.call('HSET', lock, value, now + lease)
  local token = 0
  if write then
    redis.call('HSET', lock, '=w', value)
    redis.call('DEL', mark)
    token = redis.call('INCR', fence)
  end
  -- The key lasts at least the lease. A hash just made (Redis keeps no empty hash)
  -- has no expiry yet.
  if #flat == 0 or redis.call('PTTL', lock) < lease then
    redis.call('PEXPIRE', lock, lease)
  end
  return {1, token}
end

local out = {}
for i = 1, #KEYS / 3 do
  local lock = KEYS[3 * i - 2]
  local op, value, n = ARGV[4 * i - 3], ARGV[4 * i - 2], ARGV[4 * i - 1]
  if op == 'r' or op == 'w' then
    out[i] = acquire(lock, KEYS[3 * i - 1], KEYS[3 * i], op == 'w', value, tonumber(n),
      tonumber(ARGV[4 * i]))
  else
    out[i] = {'error', 'read_write.lua: unknown operation ' .. tostring(op)}
  end
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
