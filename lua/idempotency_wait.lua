#!lua
-- idempotency_wait.lua: mark an in-flight record as waited for, so that its completion
-- publishes (idempotency_complete.lua publishes for a marked record only). A waiter
-- calls it once subscribed to the record's channel, after finding the record in flight.
--
-- KEYS[1]   the record: "F<fingerprint> <owner>" in flight, "W<fingerprint> <owner>" in
--           flight and marked, "D<fingerprint> <response>" completed
-- ARGV[..]  none
--
-- Returns what PTTL would (the caller reads both alike, as a hint of when to look again)
--   n >= 0  the record is in flight (now marked): its remaining lease in milliseconds
--   -1      in flight without an expiry (written by hand)
--   -2      not in flight any more (completed, freed or expired)
local v = redis.call('GET', KEYS[1])
if not v then
  return -2
end
local state = string.sub(v, 1, 1)
if state == 'F' then
  -- SETRANGE keeps the key's expiry.
  redis.call('SETRANGE', KEYS[1], 0, 'W')
elseif state ~= 'W' then
  return -2
end
return redis.call('PTTL', KEYS[1])
