#!lua flags=allow-oom
-- idempotency_abandon.lua: free a claimed key without storing anything (a retry runs again).
--
-- KEYS[1]   the record: a string "F<fingerprint> <owner>" while in flight (set by
--           `SET NX PX GET` in lock-core's IdempotencyStore::begin), "W<fingerprint>
--           <owner>" once a waiter marked it (idempotency_wait.lua), or
--           "D<fingerprint> <response>" once completed
-- ARGV[1]   the claim's in-flight value, "F<fingerprint> <owner>", the owner being
--           "<client id>:<claim number>"
-- Waiters listen on the channel '<record>-done' (a channel is no key, so it is not
-- declared), as for idempotency_complete.lua; the message is the abandoning client's id
-- (from the owner), so that client's own listener skips it.
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
-- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
redis.pcall('PUBLISH', KEYS[1] .. '-done', string.match(ARGV[1], ' ([^:]*)'))
return 1
