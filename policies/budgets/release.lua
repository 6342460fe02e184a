-- Drop a reservation without charging (the request failed before producing anything).
-- KEYS: 1 reserved HASH, 2 res HASH, 3 lease ZSET, 4 rate HASH of the reservation's minute.
-- ARGV: 1 request id.  Returns 1 when a reservation was released, 0 when there was none.
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return 0 end
local rec = cjson.decode(raw)
local rate_live = rec.m == KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1
for scope, _ in pairs(rec.p) do
  redis.call('HINCRBY', KEYS[1], scope, neg(rec.a))
  if rate_live then redis.call('HINCRBY', KEYS[4], scope .. '|t', neg(rec.t)) end
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
