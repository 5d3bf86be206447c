#!lua flags=allow-oom
-- read_write_extend.lua: lengthen the leases of holds of read-write locks (the hash of
-- holders that read_write.lua keeps: grant value -> the server time (ms) its lease
-- ends), one entry per hold, in one call: a batch of one is the plain call. Entries are
-- independent: each gets its own reply, in order, as if called alone. A script of its
-- own because it only overwrites a lease end it has read (a number as long as the one
-- it replaces) and the key's expiry: it runs on a full server, which refuses
-- read_write.lua's takes, so a watched hold is kept there too.
--
-- Entry i (i = 1 .. #KEYS) uses KEYS[i] and ARGV[2i-1 .. 2i]:
-- KEYS[i]     the lock
-- ARGV[2i-1]  the grant's value
-- ARGV[2i]    the lease (ms): the hold's lease ends no sooner than this from now
--
-- Returns one reply per entry (an array of them, or for a batch of one that reply alone):
--   1    its lease ends no sooner than lease ms from now
--   -1   the hold was gone (its lease had ended)
--   -2   the key holds another type, so no hold of this lock is there (as renew.lua:
--        an error would fail the renewal of every other hold of the watchdog's pass)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)

local function extend(lock, value, lease)
  local e = redis.pcall('HGET', lock, value)
  if type(e) == 'table' then
    return -2
  end
  if not e or tonumber(e) <= now then
    return -1
  end
  if now + lease > tonumber(e) then
    redis.call('HSET', lock, value, now + lease)
  end
  if redis.call('PTTL', lock) < lease then
    redis.call('PEXPIRE', lock, lease)
  end
  return 1
end

local out = {}
for i = 1, #KEYS do
  out[i] = extend(KEYS[i], ARGV[2 * i - 1], tonumber(ARGV[2 * i]))
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
