#!lua
-- acquire.lua: take a lock with a fresh grant (SET NX PX semantics) and its fencing token.
--
-- KEYS[1]  the lock: a string holding the grant's value, expiring with the lease
-- KEYS[2]  the fencing counter of the lock's hash slot (shared by the slot's locks)
-- KEYS[3]  the waiter marker of the lock (a release publishes only while it exists)
-- ARGV[1]  the grant's value (unique to this grant: client id and grant number)
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  when busy: how long past the holder's lease the waiter marker lasts, in
--          milliseconds; 0 when the caller does not wait (no marker)
--
-- Returns {code, value} (the reply convention of every lock script):
--   {1, token}   granted; token is the fencing token of this grant
--   {0, pttl}    busy: another grant holds the lock for pttl more milliseconds
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, redis.call('INCR', KEYS[2])}
end
local pttl = redis.call('PTTL', KEYS[1])
local linger = tonumber(ARGV[3])
if linger > 0 then
  redis.call('SET', KEYS[3], '1', 'PX', math.max(pttl, 0) + linger)
end
return {0, pttl}
