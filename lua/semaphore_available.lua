#!lua flags=no-writes
-- semaphore_available.lua: how many permits of an expiring semaphore (the layout of
-- semaphore_acquire.lua) are free now, expired ones counted as free. It writes
-- nothing (expired permits stay until the next acquisition removes them), so a full
-- server answers it too.
--
-- KEYS[1]  sorted set {permit id -> expiry}, expiry in ms on the Redis server's clock
-- ARGV[1]  limit: permits that may be in use at once
--
-- Returns the free permits (>= 0).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Live permits expire after now (semaphore_acquire.lua removes those at or before it).
local used = redis.call('ZCOUNT', KEYS[1], string.format('(%d', now), '+inf')
return math.max(tonumber(ARGV[1]) - used, 0)
