#!lua
-- read_write.lua: a read-write lock. Its key is a hash of its holders: each holder's
-- grant value -> the server time (ms) its lease ends; the field '=w' names the writer's
-- grant value (a grant value has no '='). Many readers, or one writer and its own
-- scope's readers (a downgrade). The key's own expiry is the longest lease in it, so a
-- lock nobody gives back goes away by itself; a holder whose lease ended is dropped by
-- the next call that looks.
--
-- A writer that waits marks the lock (KEYS[2], for `linger` ms after each attempt: as
-- long as it still waits, at most the longest pause between its attempts) and new
-- readers wait while it is marked: waiting writers are not starved by readers that
-- keep coming. A writer that stops waiting holds readers back at most `linger` ms.
--
-- ARGV[1] is the operation; KEYS[1] is always the lock:
--   acquire: KEYS[2] the writer mark, KEYS[3] the fencing counter;
--            ARGV[2] 'r' or 'w', ARGV[3] the grant's value, ARGV[4] the lease (ms),
--            ARGV[5] linger (ms; 0: the caller does not wait)
--            Returns {1, token} granted (a reader's token is 0), {0, ms} busy for at
--            most ms
--   release: KEYS[2] the release channel; ARGV[2] the value, ARGV[3] the payload
--            Returns 1 released, -1 the hold was gone already; publishes either way
--   extend:  ARGV[2] the value, ARGV[3] the lease (ms)
--            Returns 1 its lease ends no sooner than lease ms from now, -1 it was gone
local lock = KEYS[1]
local op = ARGV[1]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

-- The owner (client id and scope) of a grant value `<client>:<scope>:<grant>`.
local function owner(value)
  return string.match(value, '^(.*):')
end

-- Makes the key last at least `lease` ms.
local function last(lease)
  if redis.call('PTTL', lock) < lease then
    redis.call('PEXPIRE', lock, lease)
  end
end

if op == 'acquire' then
  local write = ARGV[2] == 'w'
  local value, lease, linger = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  -- The live holders: how many, the earliest end, the writer and its end.
  local flat = redis.call('HGETALL', lock)
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
        if redis.call('PTTL', KEYS[2]) < linger then
          redis.call('SET', KEYS[2], '1', 'PX', linger)
        end
        wait = math.min(wait, math.floor(linger / 2))
      end
      return {0, wait}
    end
  elseif writer then
    if owner(writer) ~= owner(value) then
      return {0, ends[writer] - now}
    end
  else
    local marked = redis.call('PTTL', KEYS[2])
    if marked > 0 then
      return {0, marked}
    end
  end
  redis.call('HSET', lock, value, now + lease)
  local token = 0
  if write then
    redis.call('HSET', lock, '=w', value)
    redis.call('DEL', KEYS[2])
    token = redis.call('INCR', KEYS[3])
  end
  last(lease)
  return {1, token}
elseif op == 'release' then
  local value = ARGV[2]
  local e = redis.call('HGET', lock, value)
  local held = e and tonumber(e) > now
  if e then
    redis.call('HDEL', lock, value)
  end
  if redis.call('HGET', lock, '=w') == value then
    redis.call('HDEL', lock, '=w')
  end
  if redis.call('HLEN', lock) == 0 then
    redis.call('DEL', lock)
  end
  redis.call('PUBLISH', KEYS[2], ARGV[3])
  if held then
    return 1
  end
  return -1
elseif op == 'extend' then
  local value, lease = ARGV[2], tonumber(ARGV[3])
  local e = redis.call('HGET', lock, value)
  if not e or tonumber(e) <= now then
    return -1
  end
  if now + lease > tonumber(e) then
    redis.call('HSET', lock, value, now + lease)
  end
  last(lease)
  return 1
end
return redis.error_reply('read_write.lua: unknown operation ' .. tostring(op))
