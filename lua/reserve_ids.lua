#!lua
-- reserve_ids.lua: reserve a block of sequence numbers of one UTC day's order-id counter
-- (segment mode); the caller hands them out locally.
--
-- KEYS[1]  the day's counter (a string key holding an integer), shared with next_id.lua
-- ARGV[1]  how many numbers to reserve (>= 1)
-- ARGV[2]  the counter's time to live in seconds, set by the call that creates it
--
-- Returns
--   {first, last}   the block first..last (inclusive), now the caller's alone. The caller
--                   uses no number above 4294967295 (the 32-bit sequence); first above it
--                   means the day's sequence is used up.
local count = tonumber(ARGV[1])
local last = redis.call('INCRBY', KEYS[1], count)
if last == count then
  redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return {last - count + 1, last}
