#!lua
-- fence.lua: the fencing token of a grant that was taken without one (on demand), or
-- of a write hold asked again once its lease is no longer known to hold.
--
-- KEYS[1]  the lock: a string holding the grant's value; for a write hold, the
--          read-write lock's hash of holders (see read_write.lua)
-- KEYS[2]  the fencing counter of the lock's hash slot (shared by the slot's locks)
-- ARGV[1]  the grant's value
-- ARGV[2]  'w' for a write hold
--
-- The token is taken only while the grant still holds the lock, so it is larger than
-- every token taken by an earlier holder and smaller than every later holder's.
--
-- Returns {code, value} (the reply convention of every lock script):
--   {1, token}   the grant's token
--   {-1}         expired: the lock no longer exists
--   {-2}         not owner: another grant holds the lock now
if ARGV[2] == 'w' then
  -- A key of another type is someone else's.
  local writer = redis.pcall('HGET', KEYS[1], '=w')
  if type(writer) == 'table' and writer.err then
    return {-2}
  end
  if writer == ARGV[1] then
    local time = redis.call('TIME')
    local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
    local ends = tonumber(redis.call('HGET', KEYS[1], ARGV[1]))
    if ends and ends > now then
      return {1, redis.call('INCR', KEYS[2])}
    end
    return {-1}
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return {-2}
  end
  return {-1}
end
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  return {1, redis.call('INCR', KEYS[2])}
end
if value then
  return {-2}
end
return {-1}
