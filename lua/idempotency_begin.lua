#!lua
-- idempotency_begin.lua: claim idempotency keys (`SET NX PX GET`: claim a free key or
-- read what is stored there), one entry per key, in one call. Used for batches only: a
-- claim that goes alone is the plain `SET ... NX PX ... GET` command. Entries are
-- independent: each gets its own reply, in order, as if called alone.
--
-- Entry i (i = 1 .. #KEYS) uses KEYS[i] and ARGV[2i-1 .. 2i]:
-- KEYS[i]     the record (see idempotency_complete.lua)
-- ARGV[2i-1]  the claim's in-flight value, "F<fingerprint> <owner>"
-- ARGV[2i]    the in-flight lease in milliseconds
--
-- Returns an array with one reply per entry, or for a batch of one that reply alone:
--   {}         claimed: the key was free and now holds ARGV[2i-1]
--   {value}    not claimed: what the record holds (in flight or completed)
--   {'error', message}  this entry failed (its key holds another type); the others stand
local out = {}
for i = 1, #KEYS do
  local found = redis.pcall('SET', KEYS[i], ARGV[2 * i - 1], 'NX', 'PX', ARGV[2 * i], 'GET')
  if type(found) == 'table' then
    out[i] = {'error', found.err}
  elseif found then
    out[i] = {found}
  else
    out[i] = {}
  end
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
