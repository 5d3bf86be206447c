#!lua
-- idempotency_complete.lua: store the response of a claimed key and keep it for retention.
--
-- KEYS[1]   the record: a string "F<fingerprint> <owner>" while in flight (set by
--           `SET NX PX GET` in lock-core's IdempotencyStore::begin), or
--           "D<fingerprint> <response>" once completed
-- KEYS[2]   channel announcing that the key is no longer in flight (waiters subscribe)
-- ARGV[1]   the claim's in-flight value, "F<fingerprint> <owner>"
-- ARGV[2]   the completed value, "D<fingerprint> <response>"
-- ARGV[3]   retention in milliseconds
-- ARGV[4]   payload published on KEYS[2] (the completing client's id)
--
-- Returns
--   1    stored, and waiters were told
--   0    expired: the record no longer exists (the in-flight lease ran out)
--   -1   not owner: the key was claimed again by someone else, or already completed
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if v ~= ARGV[1] then
  return -1
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[4])
return 1
