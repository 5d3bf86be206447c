#!lua
-- fenced_write.lua: write a value to a resource only if the writer's fencing token is not
-- older than the newest token the resource has seen (Kleppmann's fencing).
--
-- KEYS[1]  the resource's value (a string key)
-- KEYS[2]  the highest fencing token the resource has accepted
-- ARGV[1]  the writer's fencing token (a positive integer)
-- ARGV[2]  the value to store
--
-- Returns
--   {1, token}     written; the token is now the highest seen
--   {0, highest}   refused: a newer holder (token `highest`) has written already
local token = tonumber(ARGV[1])
local highest = tonumber(redis.call('GET', KEYS[2]) or 0)
if token < highest then
  return {0, highest}
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return {1, token}
