#!lua
-- seckill_voucher.lua: create a voucher's live state in Redis (the seckill service in
-- examples/), unless Redis already holds one under that id.
--
-- The voucher's id comes from the service's SQLite database, which never hands one out
-- twice; a hash already there means this Redis belongs to another database, and it is
-- left untouched rather than overwritten.
--
-- KEYS[1]  the voucher hash
-- ARGV[1]  stock
-- ARGV[2]  begins_at_ms ('' = no bound)
-- ARGV[3]  ends_at_ms ('' = no bound)
--
-- Returns 1 when created, 0 when the hash existed.
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'stock', ARGV[1], 'initial', ARGV[1], 'sold', 0,
  'begins_at_ms', ARGV[2], 'ends_at_ms', ARGV[3])
return 1
