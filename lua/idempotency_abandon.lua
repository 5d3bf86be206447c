#!lua
-- idempotency_abandon.lua: free a claimed key without storing anything (a retry runs again).
--
-- KEYS[1]   the record: a string "F<fingerprint> <owner>" while in flight (set by
--           `SET NX PX GET` in lock-core's IdempotencyStore::begin), "W<fingerprint>
--           <owner>" once a waiter marked it (idempotency_wait.lua), or
--           "D<fingerprint> <response>" once completed
-- KEYS[2]   channel announcing that the key is no longer in flight (waiters subscribe)
-- ARGV[1]   the claim's in-flight value, "F<fingerprint> <owner>"
-- ARGV[2]   payload published on KEYS[2] (the abandoning client's id)
--
-- Returns
--   1    freed: the record is deleted and waiters were told
--   0    expired: the record no longer exists
--   -1   not owner: claimed again by someone else, or completed; left alone
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if v ~= ARGV[1] and v ~= 'W' .. string.sub(ARGV[1], 2) then
  return -1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], ARGV[2])
return 1
