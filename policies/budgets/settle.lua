-- Charge a request's actual cost, free its reservation, append the charge to the ledger.
-- Idempotent: a done marker per request id (a field in the hash of the hour the request was
-- reserved in, with a TTL) makes a second settle a no-op.
-- KEYS: 1 spend HASH, 2 reserved HASH, 3 res HASH, 4 lease ZSET, 5 ledger STREAM,
--       6 done HASH of the reservation's hour, 7 rate HASH of the reservation's minute.
-- ARGV: 1 request id, 2 nanos to charge, 3 actual tokens, 4 done TTL s, 5 team, 6 key id or '',
--       7 overage nanos (recorded in the ledger, never charged), 8 number of scopes, then per
--       scope: name, period id (used only when the reservation is gone: its lease was
--       reclaimed, or the request was admitted while Redis was down).
-- The caller has already capped ARGV 2 and 3 by the reservation (store.capped_charge, with the
-- replica's own copy of it), so the direct path is bounded too; this script only records.
-- Returns {'ok', kind, ledger entry id} or {'dup', nanos charged the first time}.
local rid = ARGV[1]
local prev = redis.call('HGET', KEYS[6], rid)
if prev then return {'dup', prev} end

local periods = {}
local kind = 'direct'
local raw = redis.call('HGET', KEYS[3], rid)
if raw then
  kind = 'settle'
  local rec = cjson.decode(raw)
  periods = rec.p
  for scope, _ in pairs(periods) do
    redis.call('HINCRBY', KEYS[2], scope, neg(rec.a))
  end
  -- tpm counted the worst case at reserve time; correct it to the tokens really used.
  if rec.m == KEYS[7] and redis.call('EXISTS', KEYS[7]) == 1 then
    local delta = tonumber(ARGV[3]) - tonumber(rec.t)
    for scope, _ in pairs(periods) do
      redis.call('HINCRBY', KEYS[7], scope .. '|t', string.format('%d', delta))
    end
  end
  redis.call('HDEL', KEYS[3], rid)
  redis.call('ZREM', KEYS[4], rid)
else
  for i = 0, tonumber(ARGV[8]) - 1 do
    periods[ARGV[9 + 2 * i]] = ARGV[10 + 2 * i]
  end
end

local listed = {}
for scope, pid in pairs(periods) do
  redis.call('HINCRBY', KEYS[1], scope .. '|' .. pid, ARGV[2])
  listed[#listed + 1] = scope .. '=' .. pid
end
table.sort(listed)
redis.call('HSET', KEYS[6], rid, ARGV[2])
redis.call('EXPIRE', KEYS[6], tonumber(ARGV[4]))
local id = redis.call('XADD', KEYS[5], '*', 'rid', rid, 'team', ARGV[5], 'key', ARGV[6],
  'nanos', ARGV[2], 'tokens', ARGV[3], 'kind', kind, 'periods', table.concat(listed, ';'),
  'overage', ARGV[7])
return {'ok', kind, id}
