#!lua
-- fence.lua: the fencing token of a grant that was taken without one (on demand).
--
-- KEYS[1]  the lock: a string holding the grant's value
-- KEYS[2]  the fencing counter of the lock's hash slot (shared by the slot's locks)
-- ARGV[1]  the grant's value
--
-- The token is taken only while the grant still holds the lock, so it is larger than
-- every token taken by an earlier holder and smaller than every later holder's.
--
-- Returns {code, value} (the reply convention of every lock script):
--   {1, token}   the grant's token
--   {-1}         expired: the lock no longer exists
--   {-2}         not owner: another grant holds the lock now
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  return {1, redis.call('INCR', KEYS[2])}
end
if value then
  return {-2}
end
return {-1}
