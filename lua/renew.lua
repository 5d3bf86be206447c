#!lua
-- renew.lua: extend the lease of one or many held locks in one call (watchdog batches, extend).
--
-- KEYS[1..n]      lock hashes
-- ARGV[1..n]      owner id for each key, in the same order
-- ARGV[n+1..2n]   new lease in milliseconds for each key
--
-- Returns an array of n integers, one per key:
--   1    renewed
--   0    expired: the lock no longer exists
--   -1   not owner: another owner holds the lock now
local n = #KEYS
local out = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    out[i] = 0
  elseif redis.call('HEXISTS', KEYS[i], ARGV[i]) == 0 then
    out[i] = -1
  else
    redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
    out[i] = 1
  end
end
return out
