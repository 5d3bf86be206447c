#!lua
-- release.lua: give back one hold of a reentrant lock, or all of them.
--
-- KEYS[1]  lock hash  {owner -> hold count}
-- KEYS[2]  release channel of the lock (waiters subscribe to it)
-- ARGV[1]  owner id
-- ARGV[2]  lease in milliseconds, re-applied while holds remain
-- ARGV[3]  "1": drop every hold of this owner (its last local guard is gone); "0": drop one;
--          "peek": change nothing, only report (the client already knows the hold is lost)
-- ARGV[4]  payload published on KEYS[2] when the lock is freed (the releasing client's id)
--
-- Returns
--   n >= 1   still held by this owner with n holds left (with "peek": n holds, untouched)
--   0        released: the hash was deleted and a message published on KEYS[2]
--   -1       expired: the lock no longer exists
--   -2       not owner: another owner holds the lock now
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    return -1
  end
  return -2
end
if ARGV[3] == 'peek' then
  return tonumber(held)
end
if ARGV[3] == '0' and tonumber(held) > 1 then
  local left = redis.call('HINCRBY', KEYS[1], ARGV[1], -1)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return left
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', KEYS[2], ARGV[4])
return 0
