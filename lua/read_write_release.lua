#!lua flags=allow-oom
-- read_write_release.lua: give back holds of read-write locks (the hash of holders that
-- read_write.lua keeps), one entry per hold, in one call: a batch of one is the plain
-- call. Entries are independent: each gets its own reply, in order, as if called alone.
-- A script of its own because it only deletes: it runs on a full server, which refuses
-- read_write.lua's takes and extensions.
--
-- Entry i (i = 1 .. #KEYS) uses KEYS[i] and ARGV[3i-2 .. 3i]:
-- KEYS[i]     the lock
-- ARGV[3i-2]  'r' or 'w': a read or a write hold (only a write hold can name the writer)
-- ARGV[3i-1]  the grant's value
-- ARGV[3i]    the payload published on the lock's channel, '<lock>:released' (a channel
--             is no key, so it is not declared): the releasing client's id
--
-- Returns one reply per entry (an array of them, or for a batch of one that reply alone):
--   1    released
--   -1   the hold was gone already (its lease had ended); publishes either way
--   {'error', message}  this entry failed (its key holds another type); the others stand
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function release(lock, write, value, payload)
  local e = redis.pcall('HGET', lock, value)
  if type(e) == 'table' then
    return {'error', e.err}
  end
  local held = e and tonumber(e) > now
  if e then
    -- Redis deletes the hash with its last field.
    redis.call('HDEL', lock, value)
  end
  -- Only a write hold's value can name the writer.
  if write and redis.call('HGET', lock, '=w') == value then
    redis.call('HDEL', lock, '=w')
  end
  -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
  redis.pcall('PUBLISH', lock .. ':released', payload)
  if held then
    return 1
  end
  return -1
end

local out = {}
for i = 1, #KEYS do
  out[i] = release(KEYS[i], ARGV[3 * i - 2] == 'w', ARGV[3 * i - 1], ARGV[3 * i])
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
