#!lua
-- fenced_write.lua: write a value to a resource only if the writer's fencing token is
-- newer than every token the resource has accepted, or equal to the newest one and from
-- the same holder (Kleppmann's fencing, safe when a failover hands a token out twice).
--
-- KEYS[1]  the resource's value (a string key)
-- KEYS[2]  the newest token the resource has accepted and its holder (a hash: t, h)
-- ARGV[1]  the writer's fencing token (a positive integer)
-- ARGV[2]  the writer's holder id (unique per grant)
-- ARGV[3]  the value to store
--
-- Returns {code, value} (the reply convention of every lock script):
--   {1, token}     written; the token is now the newest seen
--   {-2, newest, holder}   refused: a newer token, or the same token from another holder,
--                          came first (holder: the newest token's holder id, as given)
-- Checked before any write (a script does not roll back): exactly one value.
if #ARGV ~= 3 then
  return redis.error_reply('fenced_write: expected a token, a holder and one value')
end
local token = tonumber(ARGV[1])
local seen = redis.call('HMGET', KEYS[2], 't', 'h')
local newest = tonumber(seen[1] or 0)
if token < newest or (token == newest and seen[2] ~= ARGV[2]) then
  return {-2, newest, seen[2] or '0'}
end
redis.call('HSET', KEYS[2], 't', ARGV[1], 'h', ARGV[2])
redis.call('SET', KEYS[1], ARGV[3])
return {1, token}
