#!lua
-- seckill_take.lua: take one unit of a voucher's stock for one buyer, and queue the
-- order, in one atomic step (the seckill service in examples/).
--
-- The sale window, the stock and the buyers are checked here, on the Redis server's
-- clock, so no interleaving of buyers, instances or retries can oversell or sell twice
-- to one user, with or without a lock around the call. The accepted order is appended
-- to the orders stream (or put in the RabbitMQ outbox) by the same script: an order
-- that was taken is always queued for the database (no window where stock is gone but
-- the order is nowhere).
--
-- KEYS[1]  the voucher hash: stock (left), sold, begins_at_ms, ends_at_ms ('' = open)
-- KEYS[2]  the voucher's buyers: a hash from user id to that user's order id
-- KEYS[3]  the orders stream (consumed by the service's workers), or with ARGV[4]
--          'outbox' the outbox hash (order id -> 'voucher:user:created_ms') that holds
--          an order until RabbitMQ has confirmed it
-- ARGV[1]  voucher id
-- ARGV[2]  user id
-- ARGV[3]  order id (issued by the caller; unused when the order is refused)
-- ARGV[4]  'stream' or 'outbox': what KEYS[3] is
--
-- Returns
--   {'ok', entry_id, stock_left, created_ms}
--                                 taken; entry_id is the stream entry of the order
--                                 ('outbox' in the outbox), created_ms the take's time
--   {'no-voucher'}                KEYS[1] does not exist
--   {'not-started', begins_at_ms} the sale has not begun (server clock)
--   {'ended', ends_at_ms}         the sale is over (server clock)
--   {'already-ordered', order_id} the user has an order (its id): a repeat, or the
--                                 retry of a buyer whose 201 was lost (answered
--                                 before the window is checked)
--   {'sold-out'}                  no stock left
local v = redis.call('HMGET', KEYS[1], 'stock', 'begins_at_ms', 'ends_at_ms')
if not v[1] then
  return {'no-voucher'}
end
-- A buyer with an order is told so first, even after the sale ended: that is how one
-- whose 201 was lost learns the order.
local existing = redis.call('HGET', KEYS[2], ARGV[2])
if existing then
  return {'already-ordered', existing}
end
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local begins = tonumber(v[2])
local ends = tonumber(v[3])
if begins and now_ms < begins then
  return {'not-started', v[2]}
end
if ends and now_ms >= ends then
  return {'ended', v[3]}
end
local stock = tonumber(v[1])
if stock <= 0 then
  return {'sold-out'}
end
redis.call('HINCRBY', KEYS[1], 'stock', -1)
redis.call('HINCRBY', KEYS[1], 'sold', 1)
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
if ARGV[4] == 'outbox' then
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[1] .. ':' .. ARGV[2] .. ':' .. now_ms)
  return {'ok', 'outbox', stock - 1, now_ms}
end
local entry = redis.call('XADD', KEYS[3], '*',
  'order_id', ARGV[3], 'voucher_id', ARGV[1], 'user_id', ARGV[2], 'created_ms', now_ms)
return {'ok', entry, stock - 1, now_ms}
