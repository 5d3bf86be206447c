#!lua flags=allow-oom
-- release.lua: give back grants (compare-and-delete) and wake waiters if any, one entry
-- per grant, in one call: a batch of one is the plain call. Entries are independent:
-- each gets its own reply, in order, as if called alone.
--
-- Entry i (i = 1 .. #KEYS / 3) uses KEYS[3i-2 .. 3i] and ARGV[i]:
-- KEYS[3i-2]  the lock
-- KEYS[3i-1]  the waiter marker of the lock
-- KEYS[3i]    the lock's fair queue (fair.lua): its head listens on '<channel>:<owner>'
-- ARGV[i]     the grant's value, '<client id>:<scope>:<grant number>'
-- A release is published on the lock's channel, '<lock>:released' (a channel is no key,
-- so it is not declared), with the releasing client's id (the value's first field).
--
-- Returns an array with one reply per entry, or for a batch of one that reply alone (the
-- reply convention of every batched script):
--   1    released: the lock was deleted; if someone waited, a message was published (and
--        the head of the fair queue, if any, was sent its own owner on its channel)
--   -1   expired: the lock no longer exists
--   -2   not owner: another grant holds the lock now
--   {'error', message}  this entry failed (the lock's key holds another type); the others stand
-- One entry: the grant `value` of `lock` given back.
local function give_back(lock, waiters, queue, value)
  local held = redis.pcall('GET', lock)
  if held == value then
    -- The lock exists (just read): a count of 2 means someone waited.
    if redis.call('DEL', lock, waiters) == 2 then
      local channel = lock .. ':released'
      redis.call('PUBLISH', channel, string.match(value, '^[^:]*'))
      local head = redis.call('LINDEX', queue, 0)
      if head then
        -- Not the releaser's id: a client skips its own releases' messages, but it
        -- cannot wake the head of the line itself (it does not know who heads it).
        redis.call('PUBLISH', channel .. ':' .. head, head)
      end
    end
    return 1
  elseif type(held) == 'table' then
    return {'error', held.err}
  elseif held then
    return -2
  end
  return -1
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #KEYS == 3 then return give_back(KEYS[1], KEYS[2], KEYS[3], ARGV[1]) end
local out = {}
for i = 1, #KEYS / 3 do
  out[i] = give_back(KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[i])
end
return out
