#!lua flags=allow-oom
-- release.lua: give back grants (compare-and-delete) and wake waiters if any, one entry
-- per grant, in one call: a batch of one is the plain call. Entries are independent:
-- each gets its own reply, in order, as if called alone.
--
-- The keys come a column at a time. Of n = #KEYS / 3 entries, entry i uses:
-- KEYS[i]       the lock
-- KEYS[n + i]   the waiter marker of the lock
-- KEYS[2n + i]  the lock's fair queue (fair.lua): its head listens on '<channel>:<owner>'
-- ARGV[i]       the grant's value, '<client id>:<scope>:<grant number>'
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
--
-- A redis.call costs more than the lookups it makes, and a table built key by key costs
-- more again. So a batch of three or more reads its locks and markers with one MGET and
-- deletes with one DEL, each over a run of KEYS (the reason for the columns); one or two
-- entries go one by one, where those tables would cost more than the calls they save.

-- Wakes whoever waits for `lock`, given back by grant `value`.
local function wake(lock, queue, value)
  local channel = lock .. ':released'
  -- pcall: a user whose ACL allows no channel (Redis 7's default for a new user) still
  -- gives the lock back; its waiters then wake on their backoff.
  redis.pcall('PUBLISH', channel, string.match(value, '^[^:]*'))
  local head = redis.call('LINDEX', queue, 0)
  if head then
    -- Not the releaser's id: a client skips its own releases' messages, but it
    -- cannot wake the head of the line itself (it does not know who heads it).
    redis.pcall('PUBLISH', channel .. ':' .. head, head)
  end
end

-- One entry by itself: gives back grant `value` of `lock`.
local function give_back(lock, waiters, queue, value)
  local held = redis.pcall('GET', lock)
  if held == value then
    -- The lock exists (just read): a count of 2 means someone waited.
    if redis.call('DEL', lock, waiters) == 2 then wake(lock, queue, value) end
    return 1
  elseif type(held) == 'table' then
    return {'error', held.err}
  end
  return held and -2 or -1
end

local n = #KEYS / 3
if n == 1 then return give_back(KEYS[1], KEYS[2], KEYS[3], ARGV[1]) end
if n < 3 then
  -- Two entries cost less one by one than with the tables of the way below.
  local out = {}
  for i = 1, n do out[i] = give_back(KEYS[i], KEYS[n + i], KEYS[2 * n + i], ARGV[i]) end
  return out
end
local held = redis.call('MGET', unpack(KEYS, 1, 2 * n))
-- The replies' table is made at its full size (one grown entry by entry is rehashed as
-- it grows); the woken entries' only when someone waited.
local out, woken, released, again = {unpack(ARGV)}, nil, 0, false
for i = 1, n do
  local value = held[i]
  if value == ARGV[i] then
    out[i], released = 1, released + 1
    if held[n + i] then
      woken = woken or {}
      woken[#woken + 1] = i
    end
  elseif value then
    -- Unless an earlier entry of this batch gives the lock back (see below).
    out[i], again = -2, true
  else
    -- MGET answers nil for a key of another type as for a missing one: tell them apart.
    local got = redis.pcall('GET', KEYS[i])
    out[i] = type(got) == 'table' and {'error', got.err} or -1
  end
end
if released > 0 then
  -- Every lock, and their markers if any was found: a DEL of a missing key still costs
  -- its lookup.
  local doomed, count = KEYS, woken and 2 * n or n
  if released < n then
    -- Only the released entries' locks and markers (a marker may be missing).
    doomed, count = {}, 0
    for i = 1, n do
      if out[i] == 1 then
        doomed[count + 1], doomed[count + 2], count = KEYS[i], KEYS[n + i], count + 2
      end
    end
  end
  -- Fewer keys deleted than found: a grant given back twice in this batch.
  if redis.call('DEL', unpack(doomed, 1, count)) < released + (woken and #woken or 0) then
    again = true
  end
end
if again then
  -- The batch read every lock before any release: an entry after the release of its
  -- lock, called alone, would have found the lock gone.
  local given, kept = {}, {}
  for i = 1, n do
    if given[KEYS[i]] and (out[i] == 1 or out[i] == -2) then
      out[i] = -1
    elseif out[i] == 1 then
      given[KEYS[i]] = true
    end
  end
  for _, i in ipairs(woken or kept) do
    if out[i] == 1 then kept[#kept + 1] = i end
  end
  woken = kept
end
for _, i in ipairs(woken or {}) do wake(KEYS[i], KEYS[2 * n + i], ARGV[i]) end
return out
