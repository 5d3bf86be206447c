#!lua
-- acquire.lua: take locks with fresh grants (SET NX PX semantics), one entry per lock,
-- in one call: a batch of one is the plain call. Entries are independent: each gets
-- its own reply, in order, as if called alone.
--
-- Entry i (i = 1 .. #KEYS / 3) uses KEYS[3i-2 .. 3i] and ARGV[4i-3 .. 4i]:
-- KEYS[3i-2]  the lock: a string holding the grant's value, expiring with the lease
-- KEYS[3i-1]  the fencing counter of the lock's hash slot (shared by the slot's locks)
-- KEYS[3i]    the waiter marker of the lock (a release publishes only while it exists)
-- ARGV[4i-3]  the grant's value (unique to this grant: client id and grant number)
-- ARGV[4i-2]  lease in milliseconds
-- ARGV[4i-1]  when busy: how long past the holder's lease the waiter marker lasts, in
--             milliseconds; 0 when the caller does not wait (no marker)
-- ARGV[4i]    1 to take the grant's fencing token with it, 0 not to
--
-- Returns an array with one reply per entry, or for a batch of one that reply alone (the
-- reply convention of every batched script):
--   {1, token}   granted; token is the grant's fencing token, 0 when not asked for
--   {0, pttl}    busy: another grant holds the lock for pttl more milliseconds
--   {'error', message}  this entry failed (a key of another type, a bad argument); the
--                other entries stand
local out = {}
for i = 1, #KEYS / 3 do
  local lock, fence, waiters = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local value, lease = ARGV[4 * i - 3], ARGV[4 * i - 2]
  local linger, fenced = tonumber(ARGV[4 * i - 1]), ARGV[4 * i] == '1'
  local set = redis.pcall('SET', lock, value, 'NX', 'PX', lease)
  if type(set) == 'table' and set.err then
    out[i] = {'error', set.err}
  elseif set then
    if fenced then
      local token = redis.pcall('INCR', fence)
      if type(token) == 'table' then
        -- The grant is the caller's to give back (it sees an error).
        out[i] = {'error', token.err}
      else
        out[i] = {1, token}
      end
    else
      out[i] = {1, 0}
    end
  else
    local pttl = redis.call('PTTL', lock)
    if linger and linger > 0 then
      redis.call('SET', waiters, '1', 'PX', math.max(pttl, 0) + linger)
    end
    out[i] = {0, pttl}
  end
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
