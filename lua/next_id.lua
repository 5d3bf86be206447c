#!lua
-- next_id.lua: the next sequence number of one UTC day's order-id counter (per-id mode).
--
-- KEYS[1]  the day's counter (a string key holding an integer)
-- ARGV[1]  the counter's time to live in seconds, set by the call that creates it
--
-- Returns
--   n   the counter after the increment: this id's sequence number (1 for the day's
--       first id). The caller refuses n above 4294967295: the day's 32-bit sequence
--       is used up (the counter keeps counting, so it never hands out a number twice).
local n = redis.call('INCR', KEYS[1])
if n == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return n
