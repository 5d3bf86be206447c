#!lua flags=allow-oom
-- renew.lua: lengthen the lease of one or many grants in one call (watchdog batches,
-- extend). Never shortens one (PEXPIRE GT): renewals and extensions of one grant may
-- cross on the way, and the client counts on the longest it was told.
--
-- KEYS[1..n]      the locks
-- ARGV[1..n]      the grant's value for each key, in the same order
-- ARGV[n+1..2n]   new lease in milliseconds for each key
--
-- Returns an array of n codes, one per key (the reply convention of every lock script):
--   1    renewed (or already longer)
--   -1   expired: the lock no longer exists
--   -2   not owner: another grant holds the lock now (or the key holds another type:
--        one such key must not fail the renewal of every other lock in the batch)
local n = #KEYS
local out = {}
for i = 1, n do
  local value = redis.pcall('GET', KEYS[i])
  if type(value) == 'table' then
    out[i] = -2
  elseif value == ARGV[i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[n + i], 'GT')
    out[i] = 1
  elseif value then
    out[i] = -2
  else
    out[i] = -1
  end
end
return out
