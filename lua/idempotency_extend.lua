#!lua flags=allow-oom
-- idempotency_extend.lua: renew the in-flight lease of a claimed key.
--
-- KEYS[1]   the record: a string "F<fingerprint> <owner>" while in flight (set by
--           `SET NX PX GET` in lock-core's IdempotencyStore::begin), "W<fingerprint>
--           <owner>" once a waiter marked it (idempotency_wait.lua), or
--           "D<fingerprint> <response>" once completed
-- ARGV[1]   the claim's in-flight value, "F<fingerprint> <owner>"
-- ARGV[2]   new lease in milliseconds, from now
--
-- Returns
--   1    renewed
--   0    expired: the record no longer exists
--   -1   not owner: claimed again by someone else, or completed
local v = redis.call('GET', KEYS[1])
if not v then
  return 0
end
if v ~= ARGV[1] and v ~= 'W' .. string.sub(ARGV[1], 2) then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
