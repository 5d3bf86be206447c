#!lua
-- idempotency_complete.lua: store the responses of claimed keys and keep them for
-- retention, one entry per key, in one call: a batch of one is the plain call. Entries
-- are independent: each gets its own reply, in order, as if called alone.
--
-- Entry i (i = 1 .. #KEYS) uses KEYS[i] and ARGV[3i-2 .. 3i]:
-- KEYS[i]     the record: a string "F<fingerprint> <owner>" while in flight (set by
--             `SET NX PX GET` in lock-core's IdempotencyStore::begin, alone or
--             pipelined), "W<fingerprint> <owner>" once a waiter marked it
--             (idempotency_wait.lua), or "D<fingerprint> <response>" once completed
-- ARGV[3i-2]  the claim's in-flight value, "F<fingerprint> <owner>", the owner being
--             "<client id>:<claim number>"
-- ARGV[3i-1]  the completed value, "D<fingerprint> <response>"
-- ARGV[3i]    retention in milliseconds
-- Waiters listen on the channel '<record>-done' (a channel is no key, so it is not
-- declared); it is published only for a marked record, so a completion nobody waits
-- for costs no PUBLISH. The message is the completing client's id (from the owner), so
-- that client's own listener skips it.
--
-- Returns an array with one reply per entry, or for a batch of one that reply alone:
--   1    stored, and waiters were told
--   0    expired: the record no longer exists (the in-flight lease ran out)
--   -1   not owner: the key was claimed again by someone else, or already completed
--   {'error', message}  this entry failed (its key holds another type); the others stand
local out = {}
for i = 1, #KEYS do
  local record, mine = KEYS[i], ARGV[3 * i - 2]
  local v = redis.pcall('GET', record)
  if type(v) == 'table' then
    out[i] = {'error', v.err}
  elseif not v then
    out[i] = 0
  elseif v == mine or v == 'W' .. string.sub(mine, 2) then
    redis.call('SET', record, ARGV[3 * i - 1], 'PX', ARGV[3 * i])
    if v ~= mine then
      -- pcall, as in release.lua: a publish the user's ACL refuses undoes nothing.
      redis.pcall('PUBLISH', record .. '-done', string.match(mine, ' ([^:]*)'))
    end
    out[i] = 1
  else
    out[i] = -1
  end
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
