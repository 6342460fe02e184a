-- One team's standing in one round trip (expired leases reclaimed first).
-- KEYS: 1 spend HASH, 2 reserved HASH, 3 res HASH, 4 lease ZSET, 5 limits HASH.
-- ARGV: 1 number of periods P, then P window ids (periods.py PERIODS order), then scope names.
-- Returns per scope: override or '', spent in each of the P windows, reserved.
reclaim(KEYS[2], KEYS[3], KEYS[4], now_ms(), 256)
local out = {}
local nperiods = tonumber(ARGV[1])
for i = 2 + nperiods, #ARGV do
  local s = ARGV[i]
  out[#out + 1] = redis.call('HGET', KEYS[5], s) or ''
  for p = 2, 1 + nperiods do
    out[#out + 1] = redis.call('HGET', KEYS[1], s .. '|' .. ARGV[p]) or '0'
  end
  out[#out + 1] = redis.call('HGET', KEYS[2], s) or '0'
end
return out
