-- Shared prelude of the budget scripts (prepended by policies/budgets/redis_store.py).
-- Amounts are integer nano-dollars kept as strings, so no number ever passes through
-- cjson's 14-digit formatting.

-- Redis server time, so every replica agrees on lease expiry whatever its own clock says.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Negates an integer string ('-0' is not an integer to Redis).
local function neg(s)
  if s == '0' then return '0' end
  return '-' .. s
end

-- Frees the reservations of one team whose lease has run out (their replica died or hung).
-- reserved: HASH scope -> nanos, res: HASH request id -> JSON record, lease: ZSET id -> expiry ms.
local function reclaim(reserved, res, lease, now, limit)
  local expired = redis.call('ZRANGEBYSCORE', lease, '-inf', now, 'LIMIT', 0, limit)
  for _, rid in ipairs(expired) do
    local raw = redis.call('HGET', res, rid)
    if raw then
      local rec = cjson.decode(raw)
      for scope, _ in pairs(rec.p) do
        redis.call('HINCRBY', reserved, scope, neg(rec.a))
      end
      redis.call('HDEL', res, rid)
    end
    redis.call('ZREM', lease, rid)
  end
  return #expired
end
