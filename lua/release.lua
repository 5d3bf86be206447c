#!lua
-- release.lua: give back one grant (compare-and-delete) and wake waiters if any.
--
-- KEYS[1]  the lock
-- KEYS[2]  the waiter marker of the lock
-- KEYS[3]  the release channel of the lock (waiters subscribe to it)
-- ARGV[1]  the grant's value
-- ARGV[2]  payload published on KEYS[3] (the releasing client's id)
--
-- Returns {code} (the reply convention of every lock script):
--   {1}    released: the lock was deleted; if someone waited, a message was published
--   {-1}   expired: the lock no longer exists
--   {-2}   not owner: another grant holds the lock now
local value = redis.call('GET', KEYS[1])
if value == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('DEL', KEYS[2]) == 1 then
    redis.call('PUBLISH', KEYS[3], ARGV[2])
  end
  return {1}
end
if value then
  return {-2}
end
return {-1}
