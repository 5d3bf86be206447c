#!lua
-- gcra.lua: decisions of the generic cell rate algorithm (redis-cell / redis_rate
-- semantics), on the Redis server's clock, one entry per decision, in one call: a batch
-- of one is the plain call. Entries are decided in order, each as if called alone (two
-- entries on one key see each other's effect).
--
-- Entry i (i = 1 .. #KEYS) uses KEYS[i] and ARGV[3i-2 .. 3i]:
-- KEYS[i]     the key's theoretical arrival time (TAT), microseconds on the server clock
-- ARGV[3i-2]  emission interval in microseconds (period / rate)
-- ARGV[3i-1]  burst: how many requests may arrive at once (>= 1)
-- ARGV[3i]    cost of this request (>= 1), or 0 to peek without consuming
--
-- Returns an array with one reply per entry, or for a batch of one that reply alone:
--   backlog          allowed (and, with cost > 0, counted): how far the key's TAT was
--                    ahead of now before this request, in microseconds (>= 0)
--   -1 - backlog     refused
--   {'error', message}  this entry failed (its key holds another type); the others stand
-- One number, not a table per entry: the caller derives remaining, retry-after and
-- reset-after from it and the quota it sent, and a table costs this Redis a conversion
-- per entry.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
-- Entries of one limiter send the same quota: a string equal to the previous entry's
-- (a comparison of interned strings) keeps its number instead of parsing it again.
local si, sb, sc, interval, burst, cost
for i = 1, #KEYS do
  local a, b, c = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  if a ~= si then si, interval = a, tonumber(a) end
  if b ~= sb then sb, burst = b, tonumber(b) end
  if c ~= sc then sc, cost = c, tonumber(c) end
  local stored = redis.pcall('GET', KEYS[i])
  if type(stored) == 'table' then
    out[i] = {'error', stored.err}
  else
    local tat = tonumber(stored) or now
    if tat < now then
      tat = now
    end
    local backlog = tat - now
    -- A peek decides a request of cost 1, without counting it.
    local probe = cost
    if probe == 0 then
      probe = 1
    end
    if backlog + interval * probe > interval * burst then
      out[i] = -1 - backlog
    else
      if cost > 0 then
        local new_tat = tat + interval * cost
        -- %d: the default number format would round a microsecond timestamp, and
        -- formats a whole number as a float (slower).
        redis.call('SET', KEYS[i], string.format('%d', new_tat), 'PX',
          string.format('%d', math.ceil((new_tat - now) / 1000) + 1))
      end
      out[i] = backlog
    end
  end
end
-- A batch of one answers its entry's reply alone (one array level less to parse).
if #out == 1 then return out[1] end
return out
